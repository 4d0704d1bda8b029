"""``hps plan``'s checks and the rows it plans per tier: the shared segment's size, the share
of rows L2 gets, Redis's per-partition margin, the update-version side tables and an L1
larger than its table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hps.cli import main
from hps.config import parse_config
from hps.plan import plan, totals
from hps.tiers import table_bytes
from hps.tiers.side_tables import LIMBS
from hps.tiers.watermarks import BUCKETS

KAFKA = {"type": "kafka_message_queue", "brokers": "127.0.0.1:1"}


def doc_of(
    tmp_path: Path,
    volatile: dict[str, Any],
    *,
    l3: bool = False,
    dim: int = 64,
    **model: Any,
) -> dict[str, Any]:
    persistent = {"type": "rocks_db", "path": str(tmp_path / "db")} if l3 else {"type": "disabled"}
    return {
        "supportlonglong": True,
        "models": [
            {
                "model": "m",
                "embedding_table_names": ["a"],
                "embedding_vecsize_per_table": [dim],
                "hps_cache": {"device": "numpy"},
                **model,
            }
        ],
        "volatile_db": volatile,
        "persistent_db": persistent,
    }


def write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(doc))
    return str(path)


SMALL_SEGMENT = {
    "type": "multi_process_hash_map",
    "shared_memory_size": 64 << 20,
    "shared_memory_name": "hps_test_plan_checks",  # never opened: the plan reads nothing
}


def test_an_l2_planned_beyond_the_shared_segment_is_refused_without_l3(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """1,000,000 rows of dim 64 need about 300 MiB of a 64 MiB segment: without L3 the rows
    it evicts would be answered with the default vector, so the plan is an error naming
    shared_memory_size and the bytes needed."""
    path = write(tmp_path, doc_of(tmp_path, SMALL_SEGMENT))
    assert main(["plan", "--config", path, "--rows", "m.a=1000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "shared_memory_size" in err and "67,108,864" in err and "needs" in err
    # rows that fit: no error
    assert main(["plan", "--config", path, "--rows", "m.a=1000"]) == 0
    assert "shared_memory_size" not in capsys.readouterr().out


def test_an_l2_planned_beyond_the_shared_segment_is_a_warning_with_l3(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write(tmp_path, doc_of(tmp_path, SMALL_SEGMENT, l3=True, hps_instances=2))
    assert main(["plan", "--config", path, "--rows", "m.a=1000000"]) == 0
    out = capsys.readouterr().out
    assert "warning: " in out and "shared_memory_size" in out
    assert main(["plan", "--config", path, "--rows", "m.a=1000000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("shared_memory_size" in w for w in doc["warnings"])


def test_without_l3_l2_is_planned_with_every_row(tmp_path: Path) -> None:
    """The loader fills L2 with every row where there is no L3 (initial_cache_rate is the
    share of rows L2 gets beside an L3)."""
    volatile = {"type": "hash_map", "initial_cache_rate": 0.25}
    (p,) = plan(parse_config(doc_of(tmp_path, volatile)), {"m.a": 1000})
    assert p.l2_rows == 1000
    (p,) = plan(parse_config(doc_of(tmp_path, volatile, l3=True)), {"m.a": 1000})
    assert p.l2_rows == 250


@pytest.mark.parametrize("backend", ["redis_cluster", "redis"])
def test_redis_overflow_margin_counts_per_partition(tmp_path: Path, backend: str) -> None:
    volatile = {"type": backend, "num_partitions": 8, "overflow_margin": 10_000}
    (p,) = plan(parse_config(doc_of(tmp_path, volatile, dim=16)), {"m.a": 200_000})
    assert p.l2_rows == 80_000
    (p,) = plan(parse_config(doc_of(tmp_path, volatile, dim=16)), {"m.a": 50_000})
    assert p.l2_rows == 50_000
    hash_map = {"type": "hash_map", "overflow_margin": 10_000}
    (p,) = plan(parse_config(doc_of(tmp_path, hash_map, dim=16)), {"m.a": 200_000})
    assert p.l2_rows == 10_000  # per table


def test_update_version_side_tables_are_planned_in_l2_without_l3(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Kafka updates and no L3: each table has a version side table (a row of LIMBS float32
    per updated key, at worst every row) and a watermark side table (BUCKETS rows and the
    sync key) beside it in L2."""
    doc = doc_of(tmp_path, {"type": "hash_map"}, dim=16, hps_instances=2)
    doc["update_source"] = KAFKA
    cfg = parse_config(doc)
    (p,) = plan(cfg, {"m.a": 200_000})
    vdb = cfg.volatile_db
    side = table_bytes(vdb, 200_000, LIMBS) + table_bytes(vdb, BUCKETS + 1, LIMBS)
    assert p.l2_side_bytes == side * 2  # hash_map: one L2 per instance
    assert p.l2_side_bytes_per_row > 0
    assert totals([p])["l2_bytes"] == p.l2_bytes + p.l2_side_bytes
    path = write(tmp_path, doc)
    assert main(["plan", "--config", path, "--rows", "m.a=200000"]) == 0
    assert "L2 side" in capsys.readouterr().out
    # with an L3 the versions are kept there, and without Kafka there are none
    (p,) = plan(parse_config({**doc, "persistent_db": {"type": "rocks_db", "path": "db"}}))
    assert p.l2_side_bytes == p.l2_side_bytes_per_row == 0
    (p,) = plan(parse_config(doc_of(tmp_path, {"type": "hash_map"})), {"m.a": 10})
    assert p.l2_side_bytes == 0
    assert main(["plan", "--config", write(tmp_path, doc_of(tmp_path, {"type": "hash_map"}))]) == 0
    assert "L2 side" not in capsys.readouterr().out


def test_an_l1_far_larger_than_its_table_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    doc = doc_of(
        tmp_path, {"type": "hash_map"}, hps_cache={"device": "numpy", "capacity": 5_000_000}
    )
    path = write(tmp_path, doc)
    assert main(["plan", "--config", path, "--rows", "m.a=1000"]) == 0
    out = capsys.readouterr().out
    assert "note: m.a: L1 capacity 5,000,000 rows for a table of 1,000 rows" in out
    assert "gpucacheper" in out
    assert main(["plan", "--config", path, "--rows", "m.a=4000000"]) == 0
    assert "note: m.a" not in capsys.readouterr().out


def test_rows_beyond_2_40_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, doc_of(tmp_path, {"type": "hash_map"}))
    assert main(["plan", "--config", path, "--rows", f"m.a={2**40 + 1}"]) == 2
    assert "at most 2**40" in capsys.readouterr().err
    assert main(["plan", "--config", path, "--rows", f"m.a={2**40}"]) == 0

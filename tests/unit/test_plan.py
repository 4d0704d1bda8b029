"""``hps plan``: sizes per tier from the sparse files' sizes, checked against real allocations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hps.cache import EmbeddingCache, cache_capacity
from hps.cli import main
from hps.config import parse_config
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model
from hps.plan import l2_segment_bytes, l3_bytes_per_row, plan, totals, version_costs
from hps.storage.hash_map import HashMapStore
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.storage.redis_layout import _jemalloc, redis_bytes_per_row
from hps.types import TableSpec
from tests.helpers import make_config, rows, unique_name


def ps_json(tmp_path: Path, **volatile: object) -> Path:
    write_sparse_model(
        tmp_path / "t0", np.arange(1000, dtype=np.int64), np.zeros((1000, 16), np.float32)
    )
    doc = {
        "supportlonglong": True,
        "models": [
            {
                "model": "m",
                "embedding_table_names": ["t0", "t1"],
                "embedding_vecsize_per_table": [16, 32],
                "sparse_files": [str(tmp_path / "t0"), str(tmp_path / "missing")],
                "gpucacheper": 0.5,
                "deployed_device_list": [0, 1],
                "hps_instances": 4,
                "hps_cache": {"policy": "frequency", "device": "numpy"},
            }
        ],
        "volatile_db": {"type": "hash_map", **volatile},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
    }
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(doc))
    return path


def test_plan_uses_the_real_per_row_costs(tmp_path: Path) -> None:
    cfg = parse_config(json.loads(ps_json(tmp_path).read_text()))
    t0, t1 = plan(cfg, {"m.t1": 5000})
    assert (t0.rows, t0.rows_from, t1.rows, t1.rows_from) == (1000, "sparse_files", 5000, "given")
    model = cfg.models[0]
    assert t0.cache_rows == cache_capacity(model, 1000) and t1.cache_rows == 2500
    real = EmbeddingCache(32, t1.cache_rows, policy="frequency")
    assert t1.cache_bytes == real.nbytes  # exactly what the cache allocates
    # on NumPy every instance's caches are in this host's memory, whatever the device list
    assert (t1.devices, t1.instances_per_device) == (1, 4)
    assert t1.cache_bytes_per_device == 4 * real.nbytes and t1.cache_memory == "host"
    # hash_map lives in each of the 4 instance processes
    assert t1.l2_bytes == int(5000 * HashMapStore.bytes_per_row(4 * 32)) * 4
    assert t1.l3_bytes == int(5000 * l3_bytes_per_row(cfg.persistent_db, 32))
    assert t1.raw_bytes == 5000 * 32 * 4
    assert not (tmp_path / "db").exists()  # nothing was opened


def test_the_shared_map_costs_whole_extents_of_its_segment(tmp_path: Path) -> None:
    """A table takes at least one extent of rows and one bucket: 16 MiB each in the default
    16 GiB segment, however few its rows (the 26 small tables of the demo took 833 MiB of
    /dev/shm against 17 MiB of rows x bytes_per_row)."""
    doc = json.loads(ps_json(tmp_path).read_text())
    doc["volatile_db"] = {"type": "multi_process_hash_map"}
    t0, t1 = plan(parse_config(doc), {"m.t1": 5000})
    assert t0.l2_bytes == t1.l2_bytes == 2 * (16 << 20)
    doc["volatile_db"]["shared_memory_size"] = 1 << 30  # 1 MiB extents
    t0, _ = plan(parse_config(doc), {"m.t1": 5000})
    assert t0.l2_bytes == 2 * (1 << 20)
    many = plan(parse_config(doc), {"m.t1": 100_000})[1].l2_bytes
    assert many > 100_000 * 4 * 32  # more extents as the rows need them


def test_gpu_instances_spread_over_the_device_list(tmp_path: Path) -> None:
    doc = json.loads(ps_json(tmp_path).read_text())
    doc["models"][0]["hps_cache"]["device"] = "cupy"
    doc["models"][0]["hps_instances"] = 3
    (t0, _) = plan(parse_config(doc), {"m.t1": 0})
    # Triton fills GPU 0 then 1 round robin: 2 instances on 0, 1 on 1; the plan sizes the
    # fuller one
    assert (t0.devices, t0.instances_per_device) == (2, 2)
    assert t0.cache_bytes_per_device == 2 * t0.cache_bytes
    doc["models"][0]["hps_cache"]["device"] = "auto"  # every instance on the first GPU
    (t0, _) = plan(parse_config(doc), {"m.t1": 0})
    assert (t0.devices, t0.instances_per_device) == (1, 3)


def test_l2_rows_follow_initial_cache_rate_and_overflow_margin(tmp_path: Path) -> None:
    cfg = parse_config(
        json.loads(ps_json(tmp_path, initial_cache_rate=0.3, overflow_margin=200).read_text())
    )
    (t0, _) = plan(cfg, {"m.t1": 0})
    assert t0.l2_rows == 200
    cfg = parse_config(json.loads(ps_json(tmp_path, initial_cache_rate=0.1).read_text()))
    assert plan(cfg, {"m.t1": 0})[0].l2_rows == 100


def test_redis_estimate() -> None:
    assert [_jemalloc(n) for n in (1, 9, 17, 24, 33, 65, 100, 513)] == [
        8,
        16,
        32,
        32,
        48,
        80,
        112,
        640,
    ]
    per_row = redis_bytes_per_row(4 * 16, bounded=False)
    assert 64 + 8 < per_row < 64 + 8 + 100
    assert redis_bytes_per_row(4 * 16, bounded=True) > per_row


def test_plan_command_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = ps_json(tmp_path)
    assert main(["plan", "--config", str(path), "--rows", "m.t1=5000"]) == 0
    text = capsys.readouterr().out
    assert "m.t0" in text and "m.t1" in text and "total" in text and "hash_map" in text
    assert "L3 memory per process that opens it: memtables up to 64 MiB" in text
    assert main(["plan", "--config", str(path), "--json", "--rows", "m.t1=0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["rows_from"] for t in doc["tables"]] == ["sparse_files", "given"]
    assert doc["totals"]["raw_bytes"] == 1000 * 16 * 4
    # a sparse_files folder that is not there is an error, not a table of 0 rows
    assert main(["plan", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "m.t1: sparse_files" in err and "is not a folder; give --rows m.t1=N" in err
    # tables without sparse_files (filled from .npy or L3): counted as 0 rows, and said so
    doc = json.loads(path.read_text())
    del doc["models"][0]["sparse_files"]
    path.write_text(json.dumps(doc))
    assert main(["plan", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 (unknown)" in out and "(unknown): 2 table(s) without sparse_files" in out


def test_plan_rejects_bad_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = ps_json(tmp_path)
    assert main(["plan", "--config", str(path), "--rows", "m.t1=lots"]) == 2
    assert "MODEL.TABLE=N" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown tables"):
        plan(parse_config(json.loads(path.read_text())), {"m.nope": 3})


def test_plan_for_a_table_spec_matches_build(tmp_path: Path) -> None:
    from hps.cache import build_cache
    from hps.config import CacheConfig

    cache = build_cache(TableSpec("m", "t", 8), CacheConfig(device="numpy"), 123)
    assert (
        cache.nbytes
        == plan(
            parse_config(
                {
                    "models": [
                        {
                            "model": "m",
                            "embedding_table_names": ["t"],
                            "embedding_vecsize_per_table": [8],
                            "hps_cache": {"capacity": 123, "device": "numpy"},
                        }
                    ]
                }
            ),
            {"m.t": 1},
        )[0].cache_bytes
    )


def test_plan_says_what_a_further_version_costs(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    [line] = version_costs(cfg, plan(cfg, {"demo.t0": 1000, "demo.t1": 1000}))
    assert line.startswith("model demo: each further version +")
    assert "L2 (per served version)" in line and "L3 (per kept version)" in line
    assert "hps_keep_versions = 2" in line


def test_plan_sizes_each_model_at_its_live_version(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A version 2 in other dims activated: its tables are planned, not the ps.json's."""
    from hps.config import load_config
    from hps.versions import VersionRegistry
    from hps.versions.rollout import version_entry

    path = ps_json(tmp_path)
    config = load_config(path)
    v2 = tmp_path / "v2"
    for t in ("t0", "t1"):
        write_sparse_model(v2 / t, np.arange(500, dtype=np.int64), np.zeros((500, 8), np.float32))
    entry = version_entry(config, "m", dims=[8], sparse_files=[str(v2 / "t0"), str(v2 / "t1")])
    registry = VersionRegistry(config)
    registry.begin(entry, 2)
    registry.set_state("m", 2, "ready")
    registry.set_live("m", 2)
    assert main(["plan", "--config", str(path), "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)["tables"]
    assert [(t["dim"], t["rows"]) for t in tables] == [(8, 500), (8, 500)]


def test_several_instances_are_planned_on_the_l2_serving_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A ps.json naming no L2 type whose model runs 4 instances is served on the node's
    multi_process_hash_map (one copy), and planned on it: not as 4 in-process hash_maps."""
    from hps.tiers import table_bytes
    from hps.triton.serving import serving_config

    path = ps_json(tmp_path)
    doc = json.loads(path.read_text())
    del doc["volatile_db"]["type"]
    path.write_text(json.dumps(doc))
    served = serving_config(path).volatile_db
    assert served.type == "multi_process_hash_map"
    assert main(["plan", "--config", str(path), "--rows", "m.t1=5000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["topology"]["l2"] == "node"
    t1 = out["tables"][1]
    assert t1["l2_type"] == served.type
    assert t1["l2_bytes"] == table_bytes(served, 5000, 32)  # one copy per node
    assert out["l2_segment_bytes"] == l2_segment_bytes(parse_config(doc)) > 0
    assert main(["plan", "--config", str(path), "--rows", "m.t1=5000"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("L2: shared memory, one per node")
    assert "L2 segment" in text and "(header, 256 entries)" in text


def test_the_shared_segments_fixed_bytes_are_planned_once(tmp_path: Path) -> None:
    """Before its first extent a multi_process_hash_map segment commits its header, free-extent
    stack and 256 table entries (5.05 MiB whatever its size): the plan counts them once per
    node. A segment just created holds exactly that; with two tables of 5,000 rows (float32
    and int8) in a 64 MiB segment the plan is within 6 % of what /dev/shm holds (without
    them it said a sixth of it)."""
    name = unique_name("hps_test_plan")
    cfg = make_config(
        tmp_path,
        models=[
            {
                "model": "m",
                "embedding_table_names": ["a", "b"],
                "embedding_vecsize_per_table": [16, 16],
                "hps_row_dtype": ["float32", "int8"],
                "gpucache": False,
            }
        ],
        volatile_db={
            "type": "multi_process_hash_map",
            "shared_memory_size": 64 << 20,
            "shared_memory_name": name,
        },
    )
    n = 5000
    plans = plan(cfg, {"m.a": n, "m.b": n})
    segment = l2_segment_bytes(cfg)
    assert l2_segment_bytes(make_config(tmp_path)) == 0  # hash_map: no segment
    vdb = cfg.volatile_db
    store = SharedHashMapStore(name, vdb.shared_memory_size, allocation_rate=vdb.allocation_rate)
    try:
        assert os.stat(store.path).st_blocks * 512 == segment
        for spec in cfg.tables:
            store.open_table(spec)
            keys = np.arange(n, dtype=np.int64) * 13 + 1
            store.insert(spec.name, keys, spec.fmt.encode(rows(keys, spec.dim)))
        held = os.stat(store.path).st_blocks * 512
    finally:
        store.close()
    planned = totals(plans, segment)["l2_bytes"]
    assert planned == segment + sum(p.l2_bytes for p in plans)
    assert abs(held / planned - 1) < 0.06, (held, planned)


@pytest.mark.parametrize("volatile", [{}, {"type": "multi_process_hash_map"}])
def test_a_shared_l2_without_an_entry_for_each_table_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture, volatile: dict[str, str]
) -> None:
    """257 tables do not fit the segment's 256 table entries: hps plan says so in one line
    (as hps import and hps serve do), whether the file names the shared L2 or it is the L2
    of several instances; 256 fit, with a note that their 2 kept versions do not."""
    for tables, code in ((257, 2), (256, 0)):
        doc = {
            "models": [
                {"model": "many", "embedding_vecsize_per_table": [4] * tables, "hps_instances": 2}
            ],
            "volatile_db": volatile,
        }
        path = tmp_path / "ps.json"
        path.write_text(json.dumps(doc))
        assert main(["plan", "--config", str(path)]) == code
        out, err = capsys.readouterr()
        if code:
            assert err.count("\n") == 1, err
            assert "holds at most 256 tables; the models need 257 (many: 257 tables)" in err
            assert ("the default when a model runs several instances" in err) == (not volatile)
        else:
            assert "the models' kept versions need 512; a version activated beyond" in out

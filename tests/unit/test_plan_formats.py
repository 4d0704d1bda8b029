"""``hps plan`` per row format: each table sized in its hps_row_dtype, totals per format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hps.cache import EmbeddingCache
from hps.cli import main
from hps.config import parse_config
from hps.plan import plan, totals_by_format
from hps.rowformat import FORMATS
from hps.tiers import bytes_per_row

DIM = 16


def ps_doc(tmp_path: Path) -> dict[str, object]:
    return {
        "models": [
            {
                "model": "m",
                "embedding_table_names": ["a", "b", "c"],
                "embedding_vecsize_per_table": [DIM, DIM, DIM],
                "hps_row_dtype": ["float32", "float16", "int8"],
                "gpucacheper": 0.5,
                "hps_cache": {"device": "numpy"},
            }
        ],
        "volatile_db": {"type": "redis_cluster", "address": "127.0.0.1:1"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
    }


def test_each_table_is_sized_in_its_format(tmp_path: Path) -> None:
    cfg = parse_config(ps_doc(tmp_path))
    plans = plan(cfg, {"m.a": 1000, "m.b": 1000, "m.c": 1000})
    assert [(p.row_dtype, p.row_bytes) for p in plans] == [
        ("float32", 64),
        ("float16", 32),
        ("int8", DIM + 8),
    ]
    for p in plans:
        fmt = FORMATS[p.row_dtype]
        real = EmbeddingCache(DIM, p.cache_rows, fmt=fmt)
        assert p.cache_bytes == real.nbytes  # what an L1 of this format allocates
        assert p.l2_bytes_per_row == round(bytes_per_row("redis_cluster", DIM, fmt), 1)
        assert p.l3_bytes == int(1000 * bytes_per_row("rocks_db", DIM, fmt))
        assert p.raw_bytes == 1000 * DIM * 4  # the naive float32 rule, for comparison
    a, b, c = plans
    assert a.l3_bytes > b.l3_bytes > c.l3_bytes and a.cache_bytes > b.cache_bytes > c.cache_bytes
    by_format = totals_by_format(plans)
    assert list(by_format) == ["float32", "float16", "int8"]
    assert by_format["int8"]["l3_bytes"] == c.l3_bytes


def test_plan_command_prints_formats_and_their_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(ps_doc(tmp_path)))
    rows = ["--rows", "m.a=1000", "--rows", "m.b=1000", "--rows", "m.c=1000"]
    assert main(["plan", "--config", str(path), *rows]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("table"))
    assert "format" in header and "row B" in header and "L3 B/row" in header
    for name in ("total float32", "total float16", "total int8"):
        assert name in text
    assert main(["plan", "--config", str(path), "--json", *rows]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["row_dtype"] for t in doc["tables"]] == ["float32", "float16", "int8"]
    assert (
        sum(t["l3_bytes"] for t in doc["totals_by_format"].values()) == (doc["totals"]["l3_bytes"])
    )
    assert not (tmp_path / "db").exists()  # nothing was opened

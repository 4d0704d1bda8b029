"""``hps bench cache`` on tiny streams: the fields, the oracle, and sane ratios (no timing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hps.bench.cache_hitrate import oracle_hit_rate, zipf_probabilities, zipf_stream
from hps.cache.kernels import kernel_for
from hps.cli import main


def test_oracle_is_the_mass_of_the_most_popular_keys() -> None:
    p = zipf_probabilities(1000, 1.1)
    assert p.sum() == pytest.approx(1.0) and (np.diff(p) < 0).all()
    assert oracle_hit_rate(p, 10) == pytest.approx(p[:10].sum())
    assert oracle_hit_rate(p, 1000) == pytest.approx(1.0)


def _top10(stream: np.ndarray) -> set[int]:
    keys, counts = np.unique(stream, return_counts=True)
    return set(keys[np.argsort(-counts)[:10]].tolist())


def test_drift_moves_the_hot_set() -> None:
    p = zipf_probabilities(1000, 1.3)
    stream = zipf_stream(p, 40_000, np.random.default_rng(0), phases=2, shift=100)
    first, second = stream[:20_000], stream[20_000:]
    assert not _top10(first) & _top10(second)


def test_hitrate_mode_prints_the_promised_fields(capsys: pytest.CaptureFixture) -> None:
    args = ["bench", "cache", "--keys", "5000", "--accesses", "60000", "--batch", "1024"]
    assert main([*args, "--alphas", "1.1", "--ratios", "0.05,1.0"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 * 2 * 3  # streams x ratios x policies
    for row in rows:
        for field in (
            "bench",
            "policy",
            "stream",
            "alpha",
            "keys",
            "cache_ratio",
            "hit_rate",
            "oracle_hit_rate",
            "ratio",
        ):
            assert field in row
        assert 0 < row["hit_rate"] <= row["oracle_hit_rate"] + 0.05
        if row["cache_ratio"] == 1.0:
            # The whole key set fits: the only misses are first accesses (and their repeats
            # in the same batch), never an eviction.
            assert row["hit_rate"] == pytest.approx(_only_cold_misses(row["stream"]), abs=1e-5)


def _only_cold_misses(kind: str) -> float:
    drift = kind == "drift"
    p = zipf_probabilities(5000, 1.1)
    stream = zipf_stream(p, 60_000, np.random.default_rng(7), 4 if drift else 1, 50 if drift else 0)
    skip = 15_000 // 1024 * 1024
    _, first, inverse = np.unique(stream, return_index=True, return_inverse=True)
    batch = np.arange(stream.size) // 1024
    cold = batch == (first // 1024)[inverse]
    return 1 - cold[skip:].sum() / (stream.size - skip)


def test_throughput_mode_prints_the_promised_fields(capsys: pytest.CaptureFixture) -> None:
    args = ["bench", "cache", "--mode", "throughput", "--rows", "4096", "--tables", "2"]
    assert main([*args, "--batch-per-table", "256", "--dim", "8", "--repeats", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ops = {"query", "query_numpy", "query_then_expand", "insert", "insert_forced"}
    if kernel_for(np) is not None:
        ops.add("query_tables")  # the many-table call against one call per table
    assert {r["op"] for r in rows} == ops
    for row in rows:
        assert row["keys_per_s"] > 0 and row["baseline_keys_per_s"] > 0 and row["ratio"] > 0
        assert row["device"] == "numpy" and row["device_name"]
    # Inserts as a lookup's fills make them (force=False), and forced ones (warm-up,
    # prefetch) only where the policy has an admission test.
    inserts = {(r["policy"], r["op"]): r for r in rows if r["op"].startswith("insert")}
    assert sorted(inserts) == [
        ("frequency", "insert"),
        ("frequency", "insert_forced"),
        ("lfu", "insert"),
        ("lru", "insert"),
    ]
    for (_, op), row in inserts.items():
        assert row["force"] == (op == "insert_forced") and 0 <= row["admitted"] <= 1
    tables = [r for r in rows if r["op"] == "query_tables"]
    assert all(r["tables"] == 2 and r["keys"] == 512 and r["dim"] == 8 for r in tables)
    assert len(tables) == (3 if "query_tables" in ops else 0)


def test_row_dtypes_are_compared_with_float32_in_one_run(capsys: pytest.CaptureFixture) -> None:
    args = ["bench", "cache", "--mode", "throughput", "--rows", "4096", "--tables", "2"]
    more = ["--batch-per-table", "256", "--dim", "8", "--repeats", "2", "--policies", "lru"]
    assert main([*args, *more, "--row-dtype", "all"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ops = {(r["op"], r["row_dtype"]) for r in rows}
    for fmt in ("float32", "float16", "int8"):
        assert {("query", fmt), ("query_numpy", fmt), ("insert", fmt)} <= ops
    versus = [r for r in rows if r["op"] == "query_vs_float32"]
    assert sorted(r["row_dtype"] for r in versus) == ["float16", "int8"]
    for row in versus:
        assert row["ratio"] > 0 and row["baseline_keys_per_s"] > 0 and row["dim"] == 8
    tables = [r for r in rows if r["op"] == "query_tables_vs_float32"]
    assert sorted(r["row_dtype"] for r in tables) == ["float16", "int8"]
    assert all(r["tables"] == 2 and r["keys"] == 512 and r["ratio"] > 0 for r in tables)
    assert main([*args, *more, "--row-dtype", "int8"]) == 0  # float32 joins as the baseline
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["row_dtype"] for r in rows if r["op"] == "query_vs_float32"] == ["int8"]
    assert {r["row_dtype"] for r in rows if r["op"] == "query"} == {"int8"}

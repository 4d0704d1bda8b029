"""``hps bench storage`` runs end to end on tiny sizes and prints the promised fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hps.cli import main

pytestmark = pytest.mark.integration

FIELDS = {"bench", "backend", "op", "keys_per_s", "baseline_keys_per_s", "ratio", "baseline"}


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    argv = ["bench", "storage", "--rows", "3000", "--dim", "8", "--batch", "512", "--repeats", "2"]
    assert main([*argv, *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize(
    ("backend", "server"),
    [("hash_map", None), ("rocksdb", None), ("redis", "redis_server"),
     ("redis_cluster", "redis_cluster")],
)  # fmt: skip
def test_bench_storage_reports_both_ops(
    backend: str, server: str | None, capsys: pytest.CaptureFixture[str], request: Any,
    tmp_path: Any,
) -> None:  # fmt: skip
    extra = ["--path", str(tmp_path)] if backend == "rocksdb" else []
    if server:
        extra = ["--address", request.getfixturevalue(server).address]
    out = bench(capsys, "--backend", backend, *extra)
    ops = ["fetch", "insert", "catch_up"] if backend == "rocksdb" else ["fetch", "insert"]
    assert [r["op"] for r in out] == ops
    if backend == "rocksdb":
        caught = out.pop()
        assert caught["tables"] == 26 and caught["catch_up_ms"] > 0
        assert caught["baseline_catch_up_ms"] > 0 and caught["ratio"] > 0
    for r in out:
        assert r.keys() >= FIELDS
        assert r["bench"] == "storage" and r["backend"] == backend
        assert r["keys_per_s"] > 0 and r["baseline_keys_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["keys_per_s"] / r["baseline_keys_per_s"], abs=1e-3)
    if backend == "hash_map":
        assert out[0]["raw_bytes_per_row"] == 8 + 4 * 8 and out[0]["bytes_per_row"] > 0
        assert out[0]["load_peak_bytes_per_row"] >= out[0]["raw_bytes_per_row"]
    if server:
        assert out[0]["cluster"] is (backend == "redis_cluster")
        fixture = request.getfixturevalue(server)
        nodes = getattr(fixture, "nodes", None) or [fixture.node]
        assert all(n.client().keys("hps_et{bench.t/*") == [] for n in nodes)  # cleaned up


def test_a_server_we_did_not_start_keeps_no_table_and_a_clash_names_its_cause(
    redis_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's format record goes too, so a run with another --dim works; a table of
    another format found there is refused with that cause and left alone."""
    from hps.errors import ConfigError

    address = redis_server.address
    bench(capsys, "--backend", "redis", "--address", address)
    client = redis_server.node.client()
    assert client.keys("hps_*{bench.t*") == []
    argv = ["bench", "storage", "--rows", "3000", "--dim", "16", "--batch", "512"]
    assert main([*argv, "--repeats", "2", "--backend", "redis", "--address", address]) == 0
    capsys.readouterr()
    client.set("hps_tm{bench.t}", b'{"row_dtype": "float32", "dim": 4}')  # another's table
    try:
        with pytest.raises(ConfigError, match="dim"):
            import argparse

            from hps.bench.storage import add_arguments, run

            parser = argparse.ArgumentParser()
            add_arguments(parser)
            list(run(parser.parse_args([*argv[2:], "--backend", "redis", "--address", address])))
        assert client.get("hps_tm{bench.t}") == b'{"row_dtype": "float32", "dim": 4}'
    finally:
        client.delete("hps_tm{bench.t}")

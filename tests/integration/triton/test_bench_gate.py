"""`hps bench gate` end to end with tiny sizes: the rows and their fields, no bound on the
figures (they are the bench's to report, docs/security.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

NEIGHBOUR = {
    "bench", "model", "flood_mb", "measure", "path", "protocol", "flood_protocols", "batch",
    "tables", "rounds", "requests_per_round", "p99_alone_ms", "p99_beside_flood_ms", "ratio",
    "rounds_alone_ms", "rounds_beside_ms", "flood_answers",
}  # fmt: skip
REFUSAL = {
    "bench", "model", "flood_mb", "measure", "protocol", "requests", "direct_triton_cpu_ms",
    "gated_triton_cpu_ms", "gate_cpu_ms", "ratio",
}  # fmt: skip


def test_bench_gate_prints_neighbour_and_refusal_rows() -> None:
    args = "--tables 2 --rows 1000 --instances 1 --rounds 1 --requests 10 --refusals 2"
    done = subprocess.run(
        [sys.executable, "-m", "hps.cli", "bench", "gate", *args.split(), "--flood-mb", "1"]
        + ["--flood-protocols", "grpc,http"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["measure"], r.get("path", r["protocol"])) for r in rows] == [
        ("neighbour_p99", "gate"),
        ("neighbour_p99", "direct"),
        ("refusal_cpu", "grpc"),
        ("refusal_cpu", "http"),
    ]
    for row in rows[:2]:
        assert set(row) == NEIGHBOUR and row["bench"] == "gate"
        assert len(row["rounds_alone_ms"]) == len(row["rounds_beside_ms"]) == 1
    # the flood is refused by the gate on its path, by the model on the direct one
    assert set(rows[0]["flood_answers"]) <= {"grpc StatusCode.RESOURCE_EXHAUSTED", "http 413"}
    assert set(rows[1]["flood_answers"]) <= {"grpc StatusCode.INVALID_ARGUMENT", "http 400"}
    for row in rows[2:]:
        assert set(row) == REFUSAL and row["requests"] == 2

"""``hps loadtest`` end to end: real Triton, Redis / Redis Cluster, Tansu, hps consume, Locust.

- a ~30 s mixed run (gRPC / HTTP / CTR readers with answer checks, bad requests, bulk
  updates, freshness probes) on a stack the command starts itself, held to
  loadtests/ci-thresholds.json: an error, a wrong vector or a collapse fails the suite;
- a stack on a 3-node Redis Cluster with ``hps consume``, load-tested as an existing
  deployment in the spike shape with a limit no run can meet: the quitting listener must
  fail the run, every stage of the spike has served; then every process the stack started
  is gone;
- SIGTERM of ``hps loadtest`` mid-run: Locust, ``hps serve`` and Triton all stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hps.cli import main
from hps.ctr.demo import create_demo
from hps.loadtest.stack import Stack, has_admin, start_stack
from hps.loadtest.summary import read_report

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_demo(tmp_path_factory.mktemp("lt-demo"), num_tables=4, max_rows=5000, dim=8)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_short_mixed_run_meets_the_ci_thresholds(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report"
    code = main([
        "loadtest", "--config", str(demo), "--report-dir", str(report),
        "--run-time", "30", "--users", "6", "--spawn-rate", "6", "--samples", "64-256",
        "--mix", "grpc=2,http=1,ctr=1,bad=1", "--updates", "2000",
        "--freshness-interval", "0.5", "--thresholds", str(ROOT / "loadtests/ci-thresholds.json"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out and "started: tansu; hps serve" in out, out
    rep = read_report(report)
    types = rep["types"]
    for name in ("grpc lookup", "http lookup", "grpc ctr", "grpc bad request",
                 "kafka publish", "kafka freshness", "kafka visible",
                 "kafka freshness (warm-up)"):  # fmt: skip
        assert types[name]["requests"] > 0 and types[name]["failures"] == 0, (name, types)
    if has_admin():  # the control plane is installed: its read routes were load-tested too
        for name in ("GET /readyz", "GET /v1/models", "GET /v1/models/{model}/tables/{table}"):
            assert types[name]["requests"] > 0, (name, types)
        assert types["GET /v1/models"]["failures"] == 0
    # Probes of the first 6 s (the default warm-up, 20% of the run) are reported apart.
    assert types["kafka freshness (warm-up)"]["requests"] < types["kafka freshness"]["requests"]
    # 2000 rows/s in batches of 500: about 4 publishes a second.
    assert types["kafka publish"]["rps"] > 2
    assert rep["verdict"]["passed"] and rep["verdict"]["stages"][0]["requests"] > 0
    assert (report / "report.html").stat().st_size > 10_000
    assert json.loads((report / "ps.json").read_text())["update_source"]["brokers"]
    assert (report / "ps.json").stat().st_mode & 0o777 == 0o600  # it may hold passwords
    # Freshness from the probes and from the serving processes' metric, both reported.
    fresh = rep["freshness"]
    assert fresh.probes is not None and fresh.probes.count > 0, fresh
    assert fresh.metric is not None and fresh.metric.count > 0, fresh
    assert fresh.metric.p50_ms is not None and fresh.metric.p99_ms is not None
    # An ordering, not a timing: per probe, the start of the first lookup that returned the
    # update (visible's upper end) precedes that lookup's return (the probe's end), so every
    # visible sample is at most its probe's and so are its quantiles.
    assert fresh.visible is not None and fresh.visible.count == fresh.probes.count, fresh
    assert fresh.visible.p50_ms is not None and fresh.probes.p50_ms is not None
    assert fresh.visible.p50_ms <= fresh.probes.p50_ms, fresh
    assert fresh.ratio("p50_ms") is not None
    line = next(x for x in out.splitlines() if x.startswith("freshness: "))
    assert "probes p50" in line and "hps_update_freshness_seconds p50" in line, line
    assert "visible p50" in line and "metric/visible p50" in line, line
    # Where the cores went: every part of the stack under its role, busy while the run was.
    cores = json.loads((report / "cpu.json").read_text())["cores"]
    for role in ("locust", "tritonserver", "stub demo", "broker (tansu)", "other"):
        assert role in cores, cores
    assert cores["locust"] > 0 and cores["stub demo"] > 0, cores
    assert next(x for x in out.splitlines() if x.startswith("CPU after warm-up, cores of "))


@pytest.fixture(scope="module")
def cluster_stack(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("lt-cluster")
    stack = start_stack(demo, run_dir, l2="redis_cluster", updates=True, admin=False)
    try:
        yield stack
    finally:
        stack.stop()


def test_a_broken_threshold_fails_the_run_and_the_stack_stops(
    cluster_stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster_stack.started[0] == "redis-server x3"
    assert any(s.startswith("hps consume") for s in cluster_stack.started)
    # the update topics have the load test's partitions (1 by default), not Publisher's 8
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": cluster_stack.brokers}).list_topics(timeout=10)
    topics = [t for name, t in meta.topics.items() if name.startswith("hps_et.")]
    assert topics and all(len(t.partitions) == 1 for t in topics), topics
    code = main([
        "loadtest", "--config", str(cluster_stack.config_path), "--report-dir", str(tmp_path),
        "--triton-grpc", cluster_stack.triton_grpc, "--triton-http", cluster_stack.triton_http,
        "--brokers", cluster_stack.brokers, "--run-time", "10", "--users", "4",
        "--shape", "spike", "--samples", "32", "--mix", "grpc=1,ctr=1", "--updates", "1000",
        "--threshold", "grpc lookup:p99_ms=0.001",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1, out
    assert "THRESHOLD BROKEN: grpc lookup: p99_ms" in out and "started:" not in out
    report = read_report(tmp_path)
    types = report["types"]
    assert types["grpc lookup"]["failures"] == 0 and types["grpc ctr"]["requests"] > 0
    # the spike: a quarter of the readers, all of them, a quarter again; each stage served
    stages = report["verdict"]["stages"]
    assert [s["users"] for s in stages] == [1, 4, 1], stages
    assert all(s["requests"] > 0 and s["failures"] == 0 for s in stages), stages
    assert types["kafka freshness"]["failures"] == 0
    pids = [p.pid for _, p in cluster_stack._procs]
    pids += [n.pid for s in cluster_stack._servers for n in getattr(s, "nodes", [])]
    pids += [s.pid for s in cluster_stack._servers if getattr(s, "pid", None)]
    assert len(pids) >= 6  # hps serve, hps consume, 3 redis-server, tansu
    cluster_stack.stop()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "processes left behind"
    assert os.path.exists(cluster_stack.config_path)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(FileNotFoundError):
                kids = [int(c) for c in task.read_text().split()]
                out += kids
                todo += kids
    return out


def test_sigterm_stops_locust_and_the_stack(demo: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "hps.cli", "loadtest", "--config", str(demo), "--no-admin",
           "--report-dir", str(tmp_path), "--run-time", "120", "--users", "2",
           "--samples", "32", "--mix", "grpc=1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("running Locust"):
            break
    deadline = time.monotonic() + 60  # Locust and tritonserver are up
    while time.monotonic() < deadline:
        names = set()
        for p in _descendants(proc.pid):
            with contextlib.suppress(FileNotFoundError):
                names.add(Path(f"/proc/{p}/cmdline").read_bytes())
        if any(b"locust" in n for n in names) and any(b"tritonserver" in n for n in names):
            break
        time.sleep(0.2)
    family = _descendants(proc.pid)
    assert len(family) >= 4, lines  # hps serve, tritonserver, timeout, locust (and stubs)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode != 0, "".join(lines) + out
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in family if _alive(p)], "processes left behind"

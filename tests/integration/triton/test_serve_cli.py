"""`hps demo`, `hps serve` and `hps query` as a newcomer runs them, stopped by SIGTERM (and
by Ctrl-C: twice, and when started in the background).

`hps serve` starts quietly: what it prints (stdout and stderr) from start to ready fits a
screen, with no error or warning on a healthy start, one warm-up line per model, and ends
with the ready line and the client commands; `--verbose` brings the details back. Clients
cannot write to its console (the gate's lines are counted), and a second `hps serve` of the
same ps.json is refused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hps.cache.xp import usable_cupy
from hps.ctr.demo import table_vectors
from hps.net import free_port
from tests.helpers import wait_for_banner

pytestmark = pytest.mark.integration

HPS = [sys.executable, "-m", "hps.cli"]


def run_hps(*args: str, cwd: Path) -> list[str]:
    done = subprocess.run([*HPS, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


MAX_START_LINES = 25


def serve(
    cwd: Path, http: int, *flags: str, preexec_fn: Callable[[], None] | None = None
) -> subprocess.Popen[str]:
    """`hps serve` of demo/ps.json, its stderr merged into its stdout (what a terminal shows)."""
    return subprocess.Popen(
        [
            *HPS,
            "serve",
            "--config",
            "demo/ps.json",
            "--http-port",
            str(http),
            "--grpc-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            *flags,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=preexec_fn,
    )


def test_demo_serve_query_and_sigterm(tmp_path: Path) -> None:
    run_hps("demo", "--dir", "demo", "--tables", "3", "--rows", "2000", cwd=tmp_path)
    http = free_port()
    proc = serve(tmp_path, http)
    try:
        lines = wait_for_banner(proc)
        banner = "".join(lines)
        # A start a person can read (first start: the tables are imported too).
        assert len(lines) <= MAX_START_LINES, banner
        for noise in ("ERROR", "WARNING", "connect() failed", "hps-admin-key="):
            assert noise not in banner, banner
        warm = [line for line in lines if re.match(r"^(demo|demo_ctr): warm in ", line)]
        assert sorted(line.split(":")[0] for line in warm) == ["demo", "demo_ctr"], banner
        assert "imported 3 tables: " in banner
        assert re.search(r"^ready: serving demo, demo_ctr from demo/ps\.json", banner, re.M)
        assert lines[-2].strip().endswith(f"query --url 127.0.0.1:{http} --model demo --keys 1,2,3")
        assert f" -m hps.cli query --url 127.0.0.1:{http} --model demo --keys 1,2,3" in banner
        assert "request bodies up to gRPC 0.22 MiB, HTTP 0.69 MiB (the request-size gate)" in banner
        # hps query needs no ps.json (a client off the serving machine has none)
        ps_json = tmp_path / "demo" / "ps.json"
        ps_json.rename(ps_json.with_suffix(".away"))
        lines = run_hps(
            "query",
            "--url",
            f"127.0.0.1:{http}",
            "--model",
            "demo",
            "--keys",
            "1,2,3",
            cwd=tmp_path,
        )
        rows = [json.loads(line) for line in lines]
        want = table_vectors(np.arange(2000), 16, 0)[[1, 2, 3]]
        assert [r["key"] for r in rows] == [1, 2, 3]
        np.testing.assert_allclose([r["vector"] for r in rows], want, atol=1e-6)
        scores = [
            json.loads(line)["score"]
            for line in run_hps(
                "query",
                "--url",
                f"127.0.0.1:{http}",
                "--model",
                "demo_ctr",
                "--samples",
                "3",
                cwd=tmp_path,
            )
        ]
        assert len(scores) == 3 and all(0.0 < s < 1.0 for s in scores)
        ps_json.with_suffix(".away").rename(ps_json)
        # a second hps serve of this ps.json stops before it touches the first one's key
        key = (tmp_path / "demo" / "hps-admin-key").read_bytes()
        second = subprocess.run(
            [*HPS, "serve", "--config", "demo/ps.json", "--http-port", str(free_port()),
             "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 2 and second.stdout == ""
        assert f"another hps serve (pid {proc.pid}) serves this ps.json" in second.stderr
        assert (tmp_path / "demo" / "hps-admin-key").read_bytes() == key
        # an oversized request: a count at most once a minute, not nginx's line per request
        too_large = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/demo/infer", data=b"x" * (1 << 20)
        )
        with pytest.raises(urllib.error.HTTPError, match="413"):
            urllib.request.urlopen(too_large, timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stdout is not None
        rest = proc.stdout.read()
        assert "1 x client intended to send too large body: N bytes" in rest, rest
        assert "[error]" not in rest and "/v2/models" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(OSError):  # tritonserver went with it
        urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2)


def test_verbose_serve_brings_the_details_back(tmp_path: Path) -> None:
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", "1000", cwd=tmp_path)
    http = free_port()
    proc = serve(tmp_path, http, "--verbose")
    try:
        lines = wait_for_banner(proc)
        text = "".join(lines)
        assert len(lines) > MAX_START_LINES, text
        assert "imported demo.C1: 1,000 rows" in text  # per table
        assert "INFO hps.startup: L1 demo.C2: warmed up" in text  # the models' own logs
        assert re.search(r"^I\d{4} .*successfully loaded 'demo_ctr'", text, re.M)  # Triton's
        # the tritonserver command line, its admin key redacted
        assert set(re.findall(r"hps-admin-key=(\S+)", text)) == {"<redacted>"}, text
        assert "connect() failed" not in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_stops_a_background_serve_and_a_second_one_waits(tmp_path: Path) -> None:
    """`hps serve &` from a script inherits SIGINT ignored: kill -INT still stops it. A
    second Ctrl-C (and a SIGTERM) while it stops is told it is stopping already: the stop
    goes on to a clean end, Triton gone from its port."""
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", "1000", cwd=tmp_path)
    http = free_port()
    proc = serve(tmp_path, http, preexec_fn=ignore_sigint)
    guard = threading.Timer(60, proc.kill)  # hang guard: SIGINT ignored, it would serve on
    try:
        wait_for_banner(proc)
        assert proc.stdout is not None
        guard.start()
        proc.send_signal(signal.SIGINT)
        seen = []
        while not any(line.startswith("stopping: ") for line in seen):
            line = proc.stdout.readline()
            assert line, f"hps serve ended before it said it was stopping: {seen}"
            seen.append(line)
        proc.send_signal(signal.SIGINT)  # it is draining now
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        rest = "".join(seen) + proc.stdout.read()
        assert "hps serve: already stopping (draining requests, then tritonserver)" in rest, rest
        assert "unclean shutdown" not in rest, rest
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(OSError):  # tritonserver went with it
        urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2)


@pytest.mark.skipif(usable_cupy() is not None, reason="this node has a GPU: the model serves")
def test_gpu_instances_without_a_gpu_are_refused_before_triton_starts(tmp_path: Path) -> None:
    """A model whose L1 is configured on the GPU is served by KIND_GPU instances; on a node
    without one, `hps serve` says so itself instead of leaving it to Triton's load error."""
    doc = {
        "models": [
            {
                "model": "g",
                "embedding_vecsize_per_table": [4],
                "gpucache": True,
                "hps_cache": {"device": "cupy"},
            }
        ],
        "persistent_db": {"type": "disabled"},
    }
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    http = free_port()
    done = subprocess.run(
        [*HPS, "serve", "--config", "ps.json", "--http-port", str(http),
         "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "hps serve: error:" in done.stderr and "model(s) g set hps_cache.device 'cupy'" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr and "Triton" not in done.stdout

"""`hps demo`, `hps serve` and `hps query` as a newcomer runs them, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.net import free_port
from hps.triton.demo import table_vectors
from tests.helpers import wait_for_banner

pytestmark = pytest.mark.integration

HPS = [sys.executable, "-m", "hps.cli"]


def run_hps(*args: str, cwd: Path) -> list[str]:
    done = subprocess.run([*HPS, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_demo_serve_query_and_sigterm(tmp_path: Path) -> None:
    run_hps("demo", "--dir", "demo", "--tables", "3", "--rows", "2000", cwd=tmp_path)
    http = free_port()
    proc = subprocess.Popen(
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
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = "".join(wait_for_banner(proc))
        assert f" -m hps.cli query --url 127.0.0.1:{http} --model demo --keys 1,2,3" in banner
        assert "request bodies up to gRPC 0.22 MiB, HTTP 0.66 MiB (the request-size gate)" in banner
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
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(OSError):  # tritonserver went with it
        import urllib.request

        urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2)

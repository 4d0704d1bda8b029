"""The serving image serves the demo model as a deployment runs it: read-only root
filesystem, uid 1000, no capabilities, host network on free loopback ports, the model files
and L3 in a mounted folder. A gRPC request returns the exact vectors of the demo's files;
Triton's readiness and the control plane's /readyz (from the HPS image, beside it) say 200;
``podman stop`` (SIGTERM) ends it within the grace period with exit code 0."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from hps.io.sparse_model import read_sparse_model
from hps.triton.client import Client
from hps.triton.demo import create_demo
from hps.triton.server import free_port
from tests.images.conftest import GRACE_S, SHM_SIZE, Containers
from tests.images.podman import Podman

pytestmark = pytest.mark.integration

ROWS = 1000
DIM = 16
ADMIN_COMMAND = ["admin", "--config"]  # + ps.json, as docker/compose.yaml runs it
# What a deployment gives a container (compose.yaml and the Helm chart say the same).
LOCKED_DOWN = ["--read-only", "--user=1000:1000", "--cap-drop=all", "--init", "--tmpfs=/tmp"]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def running(podman: Podman, name: str) -> bool:
    done = podman.run("inspect", "--format", "{{.State.Running}}", name, check=False)
    return done.stdout.strip() == "true"


def wait_status(
    podman: Podman, containers: Containers, name: str, url: str, timeout: float = 240
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(url) == 200:
            return
        if not running(podman, name):
            pytest.fail(f"{name} exited before {url} said 200:\n{containers.logs(name)[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"{url} not 200 after {timeout}s:\n{containers.logs(name)[-4000:]}")


def demo_folder(tmp_path: Path) -> Path:
    """The demo model in a folder the container user (uid 1000) owns; its ps.json."""
    data = tmp_path / "data"
    ps = create_demo(data / "demo", num_tables=2, max_rows=ROWS, dim=DIM)
    for path in [tmp_path, data, *data.rglob("*")]:
        os.chown(path, 1000, 1000)
    return Path(ps)


def test_serving_image_serves_the_demo(
    podman: Podman, serving_image: str, hps_image: str, containers: Containers, tmp_path: Path
) -> None:
    ps = demo_folder(tmp_path)
    data = ps.parent
    http, grpc, metrics, admin = (free_port() for _ in range(4))
    serving = containers.name("serving")
    podman.run(
        "run",
        "--detach",
        "--name",
        serving,
        "--network=host",
        *LOCKED_DOWN,
        f"--shm-size={SHM_SIZE}",
        "--volume",
        f"{data}:{data}",
        serving_image,
        "--config",
        str(ps),
        "--host",
        "127.0.0.1",
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
    )
    wait_status(podman, containers, serving, f"http://127.0.0.1:{http}/v2/health/ready")

    tables = [
        np.concatenate([k for k, _ in read_sparse_model(data / "tables" / t, DIM)])
        for t in ("C1", "C2")
    ]
    vectors = [
        np.concatenate([v for _, v in read_sparse_model(data / "tables" / t, DIM)])
        for t in ("C1", "C2")
    ]
    rows = [np.array([0, 7, ROWS - 1, 5]), np.array([3, 999])]
    keys = np.concatenate([tables[i][r] for i, r in enumerate(rows)])
    want = np.concatenate([vectors[i][r] for i, r in enumerate(rows)])
    with Client(f"127.0.0.1:{grpc}", grpc=True) as client:
        got = client.lookup("demo", keys, np.array([r.size for r in rows]))
    np.testing.assert_array_equal(got.reshape(-1, DIM), want)  # exact, bit for bit

    control = containers.name("admin")
    podman.run(
        "run",
        "--detach",
        "--name",
        control,
        "--network=host",
        *LOCKED_DOWN,
        "--volume",
        f"{data}:{data}",
        hps_image,
        *ADMIN_COMMAND,
        str(ps),
        "--host",
        "127.0.0.1",
        "--port",
        str(admin),
        "--triton-url",
        f"127.0.0.1:{http}",
    )
    wait_status(podman, containers, control, f"http://127.0.0.1:{admin}/readyz", timeout=120)

    start = time.monotonic()
    podman.run("stop", "--time", str(GRACE_S), serving, timeout=GRACE_S + 30)
    elapsed = time.monotonic() - start
    code = podman.run("inspect", "--format", "{{.State.ExitCode}}", serving).stdout.strip()
    logs = containers.logs(serving)
    assert code == "0", logs[-4000:]
    assert elapsed < GRACE_S, f"stopping took {elapsed:.1f}s"
    assert "Signal (11)" not in logs and "Signal (6)" not in logs
    assert status(f"http://127.0.0.1:{http}/v2/health/ready") == 0  # nothing listens now

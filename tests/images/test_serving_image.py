"""The serving image serves the demo model as a deployment runs it: read-only root
filesystem, uid 10001, no capabilities, host network on free loopback ports, the model files
and L3 in a mounted folder. A gRPC request returns the exact vectors of the demo's files;
Triton's readiness and the control plane's /readyz (from the HPS image, beside it) say 200;
``podman stop`` (SIGTERM) ends it within the grace period with exit code 0."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hps.ctr.demo import create_demo
from hps.errors import RequestError
from hps.io.sparse_model import read_sparse_model
from hps.net import free_port
from hps.triton.client import Client
from tests.images.conftest import GRACE_S, SHM_SIZE, UID, USER, Containers
from tests.images.podman import Podman

pytestmark = pytest.mark.integration

ROWS = 1000
DIM = 16
ADMIN_COMMAND = ["admin", "--config"]  # + ps.json, as docker/compose.yaml runs it
# What a deployment gives a container (compose.yaml and the Helm chart say the same).
LOCKED_DOWN = ["--read-only", f"--user={USER}", "--cap-drop=all", "--init", "--tmpfs=/tmp"]


def answer(url: str) -> tuple[int, str]:
    """Status and body of a GET (0 and the error when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def status(url: str) -> int:
    return answer(url)[0]


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
    code, body = answer(url)
    pytest.fail(
        f"{url} says {code} {body[:2000]} after {timeout}s:\n{containers.logs(name)[-3000:]}"
    )


def demo_folder(root: Path) -> Path:
    """The demo model in a folder the container user (uid 10001) owns; its ps.json."""
    data = root / "data"
    ps = create_demo(data / "demo", num_tables=2, max_rows=ROWS, dim=DIM)
    for path in [root, data, *data.rglob("*")]:
        os.chown(path, UID, UID)
    return Path(ps)


@dataclass
class Served:
    name: str
    ps: Path
    http: int
    grpc: int


@pytest.fixture(scope="module")
def module_containers(podman: Podman) -> Iterator[Containers]:
    started = Containers(podman)
    try:
        yield started
    finally:
        podman.container_rm(started.names)


@pytest.fixture(scope="module")
def served(
    podman: Podman,
    serving_image: str,
    module_containers: Containers,
    tmp_path_factory: pytest.TempPathFactory,
) -> Served:
    """The serving image serving the demo, locked down, on free loopback ports; ready."""
    ps = demo_folder(tmp_path_factory.mktemp("serving"))
    data = ps.parent
    http, grpc, metrics = (free_port() for _ in range(3))
    name = module_containers.name("serving")
    podman.run(
        "run",
        "--detach",
        "--name",
        name,
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
    url = f"http://127.0.0.1:{http}/v2/health/ready"
    wait_status(podman, module_containers, name, url)
    return Served(name, ps, http, grpc)


def test_grpc_request_returns_the_exact_demo_vectors(served: Served) -> None:
    tables = served.ps.parent / "tables"
    stored = [
        [np.concatenate(part) for part in zip(*read_sparse_model(tables / t, DIM), strict=True)]
        for t in ("C1", "C2")
    ]
    rows = [np.array([0, 7, ROWS - 1, 5]), np.array([3, 999])]
    keys = np.concatenate([stored[i][0][r] for i, r in enumerate(rows)])
    want = np.concatenate([stored[i][1][r] for i, r in enumerate(rows)])
    with Client(f"127.0.0.1:{served.grpc}", grpc=True) as client:
        got = client.lookup("demo", keys, np.array([r.size for r in rows]))
        # the request-size gate (nginx, installed by the Dockerfile) runs in the image
        with pytest.raises(RequestError, match="refused by the request-size gate"):
            client.lookup("demo", np.zeros(1_000_000, np.int64), np.array([1_000_000, 0]))
    np.testing.assert_array_equal(got.reshape(-1, DIM), want)  # exact, bit for bit
    assert status(f"http://127.0.0.1:{served.http}/v2/health/ready") == 200


def test_control_plane_from_the_hps_image_is_ready_beside_it(
    served: Served, podman: Podman, hps_image: str, containers: Containers
) -> None:
    data, port = served.ps.parent, free_port()
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
        str(served.ps),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--triton-url",
        f"127.0.0.1:{served.http}",
    )
    wait_status(podman, containers, control, f"http://127.0.0.1:{port}/readyz", timeout=120)


def test_sigterm_stops_it_within_the_grace_period_with_status_0(
    served: Served, podman: Podman, module_containers: Containers
) -> None:
    start = time.monotonic()
    podman.run("stop", "--time", str(GRACE_S), served.name, timeout=GRACE_S + 30)
    print(f"podman stop took {time.monotonic() - start:.1f}s")
    code = podman.run("inspect", "--format", "{{.State.ExitCode}}", served.name).stdout.strip()
    logs = module_containers.logs(served.name)
    # Within the grace period: podman sends SIGKILL once it is over, and the status would
    # then be 137, not 0; no clock is compared.
    assert code == "0", logs[-4000:]
    assert "Signal (11)" not in logs and "Signal (6)" not in logs
    assert status(f"http://127.0.0.1:{served.http}/v2/health/ready") == 0  # nothing listens

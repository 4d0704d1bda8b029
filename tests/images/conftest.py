"""Images built once per session with podman, from the wheel and the Dockerfiles in docker/.

Both images build FROM the local Debian base (tests/images/podman.py). Layers are cached in
podman's storage folder, so a second run only rebuilds what changed (nothing, for the same
sources: the wheel is reproducible). The sizes are printed once, for docs/deploy.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.images.podman import Podman

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
TAG = "0.1.0-test"
HPS_IMAGE = f"localhost/hps:{TAG}"
SERVING_IMAGE = f"localhost/hps-serving:{TAG}"
GRACE_S = 30  # the stop grace period the tests and compose.yaml give `hps serve`
SHM_SIZE = "256m"  # /dev/shm of the serving container (docs/deploy.md)
UID = 10001  # the images' user and group (USER in docker/Dockerfile.*), above a host's own UIDs
USER = f"{UID}:{UID}"


SIZES: dict[str, int] = {}  # image -> bytes, as podman reports them


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SIZES:
        sizes = ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in SIZES.items())
        terminalreporter.write_line(f"image sizes: {sizes}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.images)


@pytest.fixture(scope="session")
def podman() -> Podman:
    tool = Podman()
    tool.prune_old()
    return tool


@pytest.fixture(scope="session")
def base_image(podman: Podman) -> str:
    return podman.ensure_base()


@pytest.fixture(scope="session")
def image_sizes(podman: Podman, base_image: str) -> dict[str, int]:
    SIZES["base"] = podman.image_size(base_image)
    return SIZES


@pytest.fixture(scope="session")
def hps_image(podman: Podman, base_image: str, hps_wheel: Path, image_sizes: dict[str, int]) -> str:
    podman.build(DOCKER / "Dockerfile.hps", hps_wheel, HPS_IMAGE, {"BASE_IMAGE": base_image})
    image_sizes["hps"] = podman.image_size(HPS_IMAGE)
    return HPS_IMAGE


@pytest.fixture(scope="session")
def serving_image(
    podman: Podman, base_image: str, hps_wheel: Path, image_sizes: dict[str, int]
) -> str:
    args = {"BASE_IMAGE": base_image}
    podman.build(DOCKER / "Dockerfile.serving", hps_wheel, SERVING_IMAGE, args)
    image_sizes["serving"] = podman.image_size(SERVING_IMAGE)
    return SERVING_IMAGE


class Containers:
    """Names of the containers a test started; all removed when it ends."""

    def __init__(self, podman: Podman) -> None:
        self.podman = podman
        self.names: list[str] = []

    def name(self, prefix: str) -> str:
        name = f"hps-test-{prefix}-{os.getpid()}-{len(self.names)}"
        self.names.append(name)
        return name

    def logs(self, name: str) -> str:
        done = self.podman.run("logs", name, check=False)
        return done.stdout + done.stderr


@pytest.fixture
def containers(podman: Podman) -> Iterator[Containers]:
    started = Containers(podman)
    try:
        yield started
    finally:
        podman.container_rm(started.names)

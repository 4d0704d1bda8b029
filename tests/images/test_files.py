"""The files in docker/: hadolint on every Dockerfile, compose.yaml against the Compose spec,
and compose services that run the images and commands the image tests run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.images.conftest import DOCKER, GRACE_S, SHM_SIZE, UID, USER

DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
COMPOSE = DOCKER / "compose.yaml"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is not installed (it is in the dev extra)"
    return str(path)


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_dockerfiles_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.hps", "Dockerfile.serving"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    done = subprocess.run(
        [tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # every ignored rule comes with a comment saying why, on the lines just above it
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            rules = re.findall(r"DL\d+|SC\d+", line)
            above = " ".join(lines[max(0, i - 3) : i])
            assert rules and all(r in above for r in rules), f"{dockerfile.name}:{i + 1}"


def test_dockerfiles_take_their_base_from_a_build_arg() -> None:
    for path in DOCKERFILES:
        text = path.read_text()
        assert re.search(r"^ARG BASE_IMAGE=\S+:\S+$", text, re.M), path.name
        froms = re.findall(r"^FROM (\S+)", text, re.M)
        assert froms and all(f == "${BASE_IMAGE}" for f in froms), (path.name, froms)
        assert f"USER {USER}" in text and f"-o {UID} -g {UID} /var/lib/hps" in text, path.name
    serving = (DOCKER / "Dockerfile.serving").read_text()
    assert "ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3" in serving


def test_compose_is_valid_against_the_compose_spec() -> None:
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_ports_are_loopback_only_and_every_server_has_a_health_check() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        if svc.get("restart") != "no":
            assert "healthcheck" in svc, name
    # Redis and Kafka take writes without credentials here: not published on the host at all
    assert "ports" not in services["redis"] and "ports" not in services["kafka"]
    assert "zookeeper" not in json.dumps(services).lower()
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]


def test_compose_services_run_what_the_image_tests_run() -> None:
    """Images, entrypoints and commands as tests/images ran them; jobs before serving."""
    from tests.images import test_hps_image, test_serving_image

    services = compose()["services"]
    triton = services["triton"]
    assert triton["image"].startswith("localhost/hps-serving:")
    assert triton["command"][:2] == ["--config", "/etc/hps/ps.json"]  # after `hps serve`
    assert triton["shm_size"] == SHM_SIZE and triton["stop_grace_period"] == f"{GRACE_S}s"
    assert triton["read_only"] and triton["user"] == USER and triton["init"]
    assert triton["depends_on"]["import"]["condition"] == "service_completed_successfully"
    for name, verb in [("import", "import"), ("consumer", "consume"), ("admin", "admin")]:
        svc = services[name]
        assert svc["image"].startswith("localhost/hps:"), name
        assert svc["command"][:3] == [verb, "--config", "/etc/hps/ps.json"], name
        assert svc["read_only"] and svc["user"] == USER, name
    assert test_hps_image.CONSUME_COMMAND[0] == services["consumer"]["command"][0]
    assert test_serving_image.ADMIN_COMMAND[0] == services["admin"]["command"][0]
    assert services["admin"]["command"][-2:] == ["--triton-url", "triton:8000"]


def test_compose_ps_json_is_a_valid_config() -> None:
    from hps.config import load_config

    config = load_config(DOCKER / "stack" / "ps.json")
    assert config.update_source.type != "null"
    assert [m.model for m in config.models] == ["demo"]

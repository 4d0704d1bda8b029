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


def _image_extras(dockerfile: str) -> set[str]:
    """The extras a Dockerfile installs by default (its HPS_EXTRAS build arg)."""
    (extras,) = re.findall(r"^ARG HPS_EXTRAS=(\S+)$", (DOCKER / dockerfile).read_text(), re.M)
    return set(extras.split(","))


def _packages(extras: set[str]) -> set[str]:
    """What ``pip install 'hps[<extras>]'`` installs beyond hps's own requirements (names)."""
    import tomllib

    optional = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    found: set[str] = set()
    for extra in extras:
        for requirement in optional[extra]:
            nested = re.fullmatch(r"hps\[([\w,]+)\]", requirement)
            if nested:
                found |= _packages(set(nested.group(1).split(",")))
            else:
                found.add(re.split(r"[\[<>=;~! ]", requirement, maxsplit=1)[0])
    return found


# The extra a serving process needs for what its ps.json configures (hps.storage, hps.updates).
L2_EXTRA = {"redis": "redis", "redis_cluster": "redis"}
UPDATES_EXTRA = "kafka"


def test_serving_image_has_what_the_charts_and_composes_profiles_need() -> None:
    """The serving image's default extras cover every serving ps.json the chart renders and
    compose.yaml's triton reads: a Redis L2 needs redis-py, Kafka updates confluent-kafka
    (without them `hps serve` stops at start, naming the missing extra)."""
    from tests.helm.chart import PROFILES, config_files, manifests

    redis = {"mode": "redis", "redis": {"address": "r:6379"}}
    cases: list[str | dict[str, Any]] = [
        *PROFILES,
        {"l2": redis},
        {"kafka": {"enabled": True, "brokers": "k:9092"}},
        {"l2": redis, "kafka": {"enabled": True, "brokers": "k:9092"}},
    ]
    configs = [json.loads(config_files(manifests(case))["ps.json"]) for case in cases]
    configs.append(json.loads((DOCKER / "stack" / "ps.json").read_text()))
    needed = set()
    for config in configs:
        needed |= {L2_EXTRA[t] for t in [config["volatile_db"]["type"]] if t in L2_EXTRA}
        if config["update_source"]["type"] != "null":
            needed.add(UPDATES_EXTRA)
    assert needed == {"redis", "kafka"}  # the cases above use both
    assert _packages(needed) <= _packages(_image_extras("Dockerfile.serving"))


def test_the_gpu_build_of_the_serving_image_is_documented() -> None:
    """The stock serving image has no CuPy (its L1 runs on the host); docs/deploy.md gives
    the build argument that adds it, naming extras pyproject.toml defines."""
    assert "gpu" not in _image_extras("Dockerfile.serving")
    deploy = (DOCKER.parent / "docs" / "deploy.md").read_text()
    builds = re.findall(r"--build-arg HPS_EXTRAS=([\w,]+)", deploy)
    gpu = [set(b.split(",")) for b in builds if "gpu" in b.split(",")]
    assert gpu, "docs/deploy.md gives no HPS_EXTRAS with gpu"
    for extras in gpu:
        assert _image_extras("Dockerfile.serving") <= extras
        assert "cupy-cuda12x" in _packages(extras)


def test_compose_admin_reads_the_key_triton_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """triton's `hps serve --state-dir` is an in-memory volume the admin service mounts
    read-only, and HPS_ADMIN_KEY_FILE names the key there; given that environment, the
    control plane reads the very key hps serve wrote."""
    from hps.cli import build_parser
    from hps.service.commands import admin_key_source
    from hps.triton.admin_key import KEY_ENV, KEY_FILE_ENV, ensure_key, key_file_for

    doc = compose()
    triton, admin = doc["services"]["triton"], doc["services"]["admin"]
    serve = build_parser().parse_args(["serve", *triton["command"]])
    assert serve.state_dir

    def mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
        """Volume name -> (path in the container, mode)."""
        found = {}
        for spec in service["volumes"]:
            source, target, *mode = spec.split(":")
            found[source] = (target, mode[0] if mode else "rw")
        return found

    (volume,) = [v for v, (path, _) in mounts(triton).items() if path == serve.state_dir]
    assert mounts(triton)[volume][1] == "rw"
    assert doc["volumes"][volume]["driver_opts"]["type"] == "tmpfs"  # never on disk
    admin_path, admin_mode = mounts(admin)[volume]
    assert admin_mode == "ro"
    key_file = Path(admin["environment"][KEY_FILE_ENV])
    assert key_file.parent == Path(admin_path)

    volume_dir = tmp_path / volume  # the volume, as both containers see it
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    key, written = ensure_key(volume_dir)  # hps serve, with no key variable set
    assert written == key_file_for(volume_dir) and written.name == key_file.name
    monkeypatch.setenv(KEY_FILE_ENV, str(volume_dir / key_file.name))
    assert admin_key_source(tmp_path / "etc-hps")() == key

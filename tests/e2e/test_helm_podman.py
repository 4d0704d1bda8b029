"""The single-pod profile, rendered by the chart, runs under `podman kube play`.

The images are the ones of docker/ (the images issue), built the way its tests build them
(tests/images/podman.py: a Debian base made by mmdebstrap, the hps wheel, layers cached).
The rendered ConfigMap and serving pod are played as they are (the chart renders no
Secret: Triton's admin key is the one `hps serve` writes into the pod's admin-key volume),
except for what podman 4.3 (Debian 12) cannot take; each adaptation is one function below
and is listed in helm/hps/README.md ("Running the chart under podman"):

1. the Deployment is played as its pod template (`kind: Pod`, restartPolicy OnFailure):
   podman restarts a Deployment's init containers under its restartPolicy Always;
   bare pods refuse annotation values over 63 characters, so checksum/config is dropped;
2. hostNetwork (on free ports given as values) instead of podman's bridge network, which
   would change the host's firewall; podman then refuses containerPorts, so they are
   dropped and the probes' named ports become numbers.
3. /dev/shm is podman's own tmpfs (64 MB, enough for the demo): podman ignores emptyDir's
   medium: Memory and sizeLimit and makes a root-owned folder on disk that uid 10001 cannot
   write (Triton's Python backend then fails to create its shared-memory region).
podman also ignores the startup and readiness probes (Triton's readiness is polled here).

Then a real Triton request through the pod's HTTP port returns the demo's exact vectors,
the control plane reads the very key `hps serve` generated, and the chart's `helm test` pod
(its URL pointed at 127.0.0.1) passes.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hps.ctr.demo import table_vectors
from hps.net import free_port
from hps.triton.client import Client
from tests.helm.chart import of_kind, profile_values, render

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 600


def _images() -> Any:
    """The image tests' module: the chart runs the images they build."""
    return importlib.import_module("tests.images.conftest")


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Podman, with both images built as the image tests build them (cached layers)."""
    images = _images()
    from tests.fixtures.wheel import build_wheel

    pm = images.Podman()
    base = pm.ensure_base()
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    for dockerfile, tag in (
        ("Dockerfile.serving", images.SERVING_IMAGE),
        ("Dockerfile.hps", images.HPS_IMAGE),
    ):
        pm.build(images.DOCKER / dockerfile, wheel, tag, {"BASE_IMAGE": base})
    return pm


def _image(tag: str) -> dict[str, str]:
    repository, _, version = tag.rpartition(":")
    return {"repository": repository, "tag": version}


def _values(ports: dict[str, int]) -> dict[str, Any]:
    images = _images()
    values = profile_values("single-pod")
    values["images"] = {
        "serving": _image(images.SERVING_IMAGE),
        "hps": _image(images.HPS_IMAGE),
    }
    values["triton"] = {
        **values["triton"],
        "httpPort": ports["http"],
        "grpcPort": ports["grpc"],
        "metricsPort": ports["metrics"],
    }
    values["controlPlane"] = {"port": ports["admin"]}
    return values


def as_pod(workload: dict[str, Any]) -> dict[str, Any]:
    """Adaptation 1: the workload's pod template as a Pod that does not rerun its inits."""
    template = copy.deepcopy(workload["spec"]["template"])
    template["metadata"]["annotations"].pop("checksum/config")
    spec = template["spec"]
    spec["restartPolicy"] = "OnFailure"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": workload["metadata"]["name"], **template["metadata"]},
        "spec": spec,
    }


def host_network(pod: dict[str, Any]) -> None:
    """Adaptation 2: the host's network; no containerPorts, numeric probe ports."""
    pod["spec"]["hostNetwork"] = True
    for container in pod["spec"]["containers"]:
        ports = {p["name"]: p["containerPort"] for p in container.pop("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container.get(probe, {}).get("httpGet")
            if get:
                get["port"] = ports.get(get["port"], get["port"])


def podman_shm(pod: dict[str, Any]) -> None:
    """Adaptation 3: no /dev/shm volume, so podman's own tmpfs stays in place."""
    spec = pod["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "shm"]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        mounts = container.get("volumeMounts", [])
        container["volumeMounts"] = [m for m in mounts if m["name"] != "shm"]


def play_documents(values: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What `podman kube play` gets for the release, and the adapted `helm test` pod."""
    docs = []
    tests = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        parsed = [d for d in yaml.safe_load_all(text) if d]
        (tests if "/tests/" in path else docs).extend(parsed)
    (workload,) = [d for d in docs if d["kind"] == "Deployment"]
    assert not of_kind(docs, "Secret")  # the chart renders no secret
    pod = as_pod(workload)
    host_network(pod)
    podman_shm(pod)
    play = [*of_kind(docs, "ConfigMap"), pod]
    (test_pod,) = of_kind(tests, "Pod")
    test_pod["spec"]["hostNetwork"] = True
    cmd = test_pod["spec"]["containers"][0]["command"]
    cmd[cmd.index("--url") + 1] = f"127.0.0.1:{values['triton']['httpPort']}"  # no cluster DNS
    (script_cm,) = of_kind(tests, "ConfigMap")
    test_pod["metadata"].pop("annotations")  # helm hooks mean nothing to podman
    return play, {"docs": [script_cm], "pod": test_pod}


def _wait_http(url: str, deadline: float, logs: Any) -> None:
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(2)
    pytest.fail(f"{url} not ready ({last}); logs:\n{logs()}")


@pytest.fixture(scope="module")
def pod(podman: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ports = {k: free_port() for k in ("http", "grpc", "metrics", "admin")}
    values = _values(ports)
    play, test = play_documents(values)
    folder = tmp_path_factory.mktemp("kube")
    manifest = folder / "pod.yaml"
    manifest.write_text(yaml.safe_dump_all(play))
    names = [d["metadata"]["name"] for d in play if d["kind"] == "ConfigMap"]
    name = play[-1]["metadata"]["name"]

    def logs() -> str:
        out = []
        for c in ("import", "model-demo", "triton", "control-plane"):
            done = podman.run("logs", "--tail", "40", f"{name}-{c}", check=False)
            out.append(f"--- {c}\n{done.stdout}{done.stderr}")
        return "\n".join(out)

    try:
        podman.run("kube", "play", str(manifest), timeout=START_TIMEOUT_S)
        deadline = time.monotonic() + START_TIMEOUT_S
        _wait_http(f"http://127.0.0.1:{ports['http']}/v2/health/ready", deadline, logs)
        yield {
            "name": name,
            "ports": ports,
            "values": values,
            "test": test,
            "folder": folder,
            "logs": logs,
            "deadline": deadline,
        }
    finally:
        podman.run("kube", "down", str(manifest), check=False, timeout=120)
        podman.run("pod", "rm", "--force", name, check=False)
        podman.run("volume", "rm", "--force", *names, check=False)


def test_triton_returns_demo_vectors(pod: dict[str, Any]) -> None:
    demo = pod["values"]["modelSource"]["demo"]
    keys = np.array([0, 1, 2, demo["rows"] - 1], dtype=np.int64)
    with Client(f"127.0.0.1:{pod['ports']['http']}") as client:
        got = client.lookup("demo", np.tile(keys, demo["tables"]), [keys.size] * demo["tables"])
    rows = np.arange(demo["rows"], dtype=np.int64)  # the demo's row k is the k-th drawn
    want = np.concatenate(
        [table_vectors(rows, demo["dim"], i, seed=0)[keys] for i in range(demo["tables"])]
    )
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_control_plane_ready(pod: dict[str, Any]) -> None:
    """The pod's readiness probe: the control plane's /readyz (once hps admin exists)."""
    _wait_http(f"http://127.0.0.1:{pod['ports']['admin']}/readyz", pod["deadline"], pod["logs"])


def test_control_plane_reads_the_key_hps_serve_generated(pod: dict[str, Any], podman: Any) -> None:
    """No Secret holds Triton's admin key: hps serve wrote a fresh one (0600) into the pod's
    in-memory admin-key volume, and the control plane reads that very file. Compared by
    digest: the key itself is never printed."""
    from hps.triton.admin_key import KEY_FILE_ENV

    (workload,) = [d for d in play_documents(pod["values"])[0] if d["kind"] == "Pod"]
    control_plane = {c["name"]: c for c in workload["spec"]["containers"]}["control-plane"]
    key_file = {v["name"]: v["value"] for v in control_plane["env"]}[KEY_FILE_ENV]
    seen = {}
    for container in ("triton", "control-plane"):
        done = podman.run(
            "exec",
            f"{pod['name']}-{container}",
            "sh",
            "-c",
            'stat -c %a "$1"; sha256sum "$1"',
            "-",
            key_file,
            check=False,
        )
        assert done.returncode == 0, f"{container}: {done.stderr}\n{pod['logs']()}"
        mode, digest = done.stdout.split()[:2]
        assert mode == "600", container
        seen[container] = digest
    assert seen["triton"] == seen["control-plane"]


def test_helm_test_pod_passes(pod: dict[str, Any], podman: Any) -> None:
    folder: Path = pod["folder"]
    manifest = folder / "test.yaml"
    test = pod["test"]
    manifest.write_text(yaml.safe_dump_all([*test["docs"], test["pod"]]))
    name = test["pod"]["metadata"]["name"]
    container = f"{name}-{test['pod']['spec']['containers'][0]['name']}"
    try:
        podman.run("kube", "play", str(manifest), timeout=300)
        done = podman.run("wait", container, timeout=300)
        logs = podman.run("logs", container, check=False)
        assert done.stdout.strip() == "0", f"helm test pod failed:\n{logs.stdout}{logs.stderr}"
        assert "demo: 2 tables checked" in logs.stdout + logs.stderr
    finally:
        podman.run("pod", "rm", "--force", name, check=False)
        podman.run(
            "volume", "rm", "--force", *[d["metadata"]["name"] for d in test["docs"]], check=False
        )

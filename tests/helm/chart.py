"""Rendering helm/hps offline for the tests: profiles, manifests, containers."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "hps"
EXAMPLES = CHART / "examples"
PROFILES = sorted(p.stem for p in EXAMPLES.glob("*.yaml"))
RELEASE = "rel"
NAMESPACE = "hps-test"
KUBE_VERSIONS = ["1.29", "1.33"]


@functools.cache
def chart() -> Any:
    import helm_python as helm

    return helm.Chart.load(str(CHART))


def profile_values(profile: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{profile}.yaml").read_text())
    return values


@functools.cache
def _render(profile: str) -> dict[str, str]:
    rendered: dict[str, str] = chart().render(
        profile_values(profile), name=RELEASE, namespace=NAMESPACE
    )
    return rendered


def render(values: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included)."""
    rendered: dict[str, str] = chart().render(values, name=RELEASE, namespace=namespace)
    return rendered


def manifests(profile: str | dict[str, Any], namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every Kubernetes object the profile (a name or values) renders, hooks included."""
    if isinstance(profile, str) and namespace == NAMESPACE:
        rendered = _render(profile)
    else:
        rendered = render(
            profile_values(profile) if isinstance(profile, str) else profile, namespace
        )
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(profile: str) -> str:
    return next(t for p, t in _render(profile).items() if p.endswith("NOTES.txt"))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def serving_workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (workload,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "serving"
    ]
    return workload


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every workload and bare pod."""
    specs = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            specs.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
        elif d["kind"] == "Pod":
            specs.append((d["metadata"]["name"], d["spec"]))
    return specs


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def config_files(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The ps.json files of the release's ConfigMap."""
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")]
    data: dict[str, str] = cm["data"]
    return data


def mounted_file(
    docs: list[dict[str, Any]], spec: dict[str, Any], container: dict[str, Any], path: str
) -> str:
    """The text a container reads at ``path``: the key of the ConfigMap mounted above it."""
    (mount,) = [
        m
        for m in container.get("volumeMounts", [])
        if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "configMap" in volume, f"{path}: {mount['name']} is not a ConfigMap volume"
    (cm,) = [
        d
        for d in of_kind(docs, "ConfigMap")
        if d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    key = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    assert key in cm["data"], f"{path}: no {key} in ConfigMap {cm['metadata']['name']}"
    text: str = cm["data"][key]
    return text

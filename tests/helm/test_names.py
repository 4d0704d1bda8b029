"""Object names stay within Kubernetes' limits for every legal release name (Helm: at most
53 characters), and every name an object refers to is one the release renders."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.helm.chart import NAMESPACE, PROFILES, chart, of_kind, pod_specs, profile_values

LONGEST_RELEASE = "r" * 53


def _docs(values: dict[str, Any], release: str) -> list[dict[str, Any]]:
    rendered = chart().render(values, name=release, namespace=NAMESPACE)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("release", [LONGEST_RELEASE, "hps-" + "x" * 49])
def test_names_fit_with_the_longest_release_name(profile: str, release: str) -> None:
    docs = _docs(profile_values(profile), release)
    for doc in docs:
        name = doc["metadata"]["name"]
        # a Service's name is a DNS label; every other object keeps to the same 63
        assert len(name) <= 63, f"{doc['kind']} {name}: {len(name)} characters"
        assert not name.endswith("-"), name
        if doc["kind"] == "StatefulSet":  # its controller-revision-hash label: name-<hash>
            assert len(name) <= 52, f"StatefulSet {name}: {len(name)} characters"
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert len(names) == len(docs), "two objects of a kind share a name"
    for name, pod in pod_specs(docs):
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names, (name, volume)
    for doc in of_kind(docs, "StatefulSet"):
        assert ("Service", doc["spec"]["serviceName"]) in names
    for doc in of_kind(docs, "HorizontalPodAutoscaler"):
        target = doc["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) in names


def test_short_names_unchanged() -> None:
    """Shortening applies only where a name would not fit."""
    docs = _docs(profile_values("everything"), "rel")
    assert sorted({d["metadata"]["name"] for d in docs}) == [
        "rel-hps",
        "rel-hps-config",
        "rel-hps-l2-updater",
        "rel-hps-pods",
        "rel-hps-test",
    ]
    assert of_kind(docs, "StatefulSet")[0]["metadata"]["name"] == "rel-hps"

"""helm/hps: lint, render and validate every example profile, offline.

Helm's own lint and renderer (the Go SDK bundled by helm-python-sdk), then every rendered
object against the Kubernetes OpenAPI schemas of two releases (kubernetes-validate, strict:
unknown fields fail). ServiceMonitor is a CRD with no schema there; it is the only skip.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    PROFILES,
    config_files,
    containers,
    manifests,
    mounted_file,
    notes,
    of_kind,
    pod_specs,
    profile_values,
    serving_workload,
)

CRDS = {"ServiceMonitor"}


def test_profiles_shipped() -> None:
    assert PROFILES == ["everything", "persistence", "redis-kafka-gpu", "single-pod"]


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_lint_strict(profile: str | None) -> None:
    import helm_python as helm

    values = profile_values(profile) if profile else None
    for kube in ("v1.29.0", "v1.33.0"):
        report = helm.lint(str(CHART), values, strict=True, kube_version=kube)
        assert report["total_charts_linted"] == 1
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_manifests_valid(profile: str, kube: str) -> None:
    import kubernetes_validate as kv

    skipped = set()
    docs = manifests(profile)
    for doc in docs:
        try:
            kv.validate(doc, kube, strict=True)
        except kv.SchemaNotFoundError:
            skipped.add(doc["kind"])
        except kv.ValidationError as exc:
            pytest.fail(f"{profile} {doc['kind']}/{doc['metadata']['name']} (k8s {kube}): {exc}")
    assert skipped <= CRDS
    assert len(docs) >= 7


@pytest.mark.parametrize("profile", PROFILES)
def test_labels_and_security(profile: str) -> None:
    docs = manifests(profile)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        for key in ("name", "instance", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (doc["kind"], key)
        assert doc["metadata"]["namespace"] == NAMESPACE, (doc["kind"], doc["metadata"]["name"])
    for name, spec in pod_specs(docs):
        assert spec["automountServiceAccountToken"] is False, name
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["seccompProfile"]["type"] == "RuntimeDefault"
        # the images' user (docker/Dockerfile.*), above the UIDs a host hands out
        assert (psc["runAsUser"], psc["runAsGroup"], psc["fsGroup"]) == (10001, 10001, 10001)
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, (name, c["name"])
            assert (sc["runAsUser"], sc["runAsGroup"]) == (10001, 10001), (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert c["resources"]["requests"] and c["resources"]["limits"], (name, c["name"])
            assert "@sha256:" in c["image"] or ":" in c["image"].rsplit("/", 1)[-1]


@pytest.mark.parametrize("profile", PROFILES)
def test_serving_pod(profile: str) -> None:
    values = profile_values(profile)
    docs = manifests(profile)
    workload = serving_workload(docs)
    persistent = values.get("persistence", {}).get("enabled", False)
    assert workload["kind"] == ("StatefulSet" if persistent else "Deployment")
    template = workload["spec"]["template"]
    spec = template["spec"]
    assert "checksum/config" in template["metadata"]["annotations"]
    by_name = {c["name"]: c for c in containers(spec)}
    triton, admin = by_name["triton"], by_name["control-plane"]
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert (
        triton["startupProbe"]["failureThreshold"] * triton["startupProbe"]["periodSeconds"] >= 600
    )
    assert admin["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "preStop" in triton["lifecycle"]
    assert spec["terminationGracePeriodSeconds"] > int(
        triton["lifecycle"]["preStop"]["exec"]["command"][1]
    )
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert (
        volumes["shm"]["emptyDir"]["medium"] == "Memory" and volumes["shm"]["emptyDir"]["sizeLimit"]
    )
    if persistent:
        assert "l3" not in volumes
        assert workload["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "l3"
    else:
        assert volumes["l3"]["emptyDir"]["sizeLimit"]
    gpu = values.get("triton", {}).get("gpu", {}).get("enabled", False)
    assert ("nvidia.com/gpu" in triton["resources"]["limits"]) == gpu
    assert ("runtimeClassName" in spec) == bool(values.get("triton", {}).get("runtimeClassName"))
    assert spec["initContainers"][-1]["name"] == "import"


def test_everything_features() -> None:
    docs = manifests("everything")
    (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    kinds = {m["type"] for m in hpa["spec"]["metrics"]}
    assert kinds == {"Resource", "Pods"}
    assert "replicas" not in serving_workload(docs)["spec"]  # the HPA owns it
    assert of_kind(docs, "ServiceMonitor") and of_kind(docs, "PodDisruptionBudget")
    policies = {p["metadata"]["name"]: p for p in of_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"rel-hps", "rel-hps-l2-updater", "rel-hps-test"}
    test_egress = policies["rel-hps-test"]["spec"]["egress"]
    assert [p["port"] for rule in test_egress for p in rule["ports"]] == [53, 53, 8000]
    egress_ports = {
        p["port"] for rule in policies["rel-hps"]["spec"]["egress"] for p in rule["ports"]
    }
    assert egress_ports == {53, 6379, 9093}
    spec = serving_workload(docs)["spec"]["template"]["spec"]
    assert (
        spec["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"][
            "app.kubernetes.io/component"
        ]
        == "serving"
    )
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert all("@sha256:" in c["image"] for c in containers(spec))
    assert not [s for s in of_kind(docs, "Secret")]  # the chart renders none (test_no_secret)


def test_notes_tell_first_request() -> None:
    text = notes("single-pod")
    assert "port-forward svc/rel-hps 8000:8000" in text
    assert "/v2/models/demo/infer" in text and "helm test rel" in text


def test_test_hook_pod() -> None:
    (pod,) = of_kind(manifests("single-pod"), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    cmd = pod["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["python3", "/opt/hps-test/helm_test.py"] and "--demo-seed" in cmd


@pytest.mark.parametrize("profile", PROFILES)
def test_test_pod_has_no_secret_and_its_own_config(profile: str) -> None:
    """The helm test pod reads a ps.json of the models alone, from its own ConfigMap: no
    Secret volume, no environment, nothing of the release's L2, L3 or updates."""
    import json

    docs = manifests(profile)
    (pod,) = of_kind(docs, "Pod")
    (container,) = pod["spec"]["containers"]
    assert "env" not in container
    assert all(set(v) <= {"name", "configMap", "emptyDir"} for v in pod["spec"]["volumes"])
    cmd = container["command"]
    config = json.loads(mounted_file(docs, pod["spec"], container, cmd[cmd.index("--config") + 1]))
    assert config["models"] == json.loads(config_files(docs)["ps.json"])["models"]
    assert config["volatile_db"] == {"type": "disabled"}
    assert config["persistent_db"] == {"type": "disabled"}
    assert config["update_source"] == {"type": "null"}


def _egress_ports(docs: list[dict[str, Any]], name: str) -> list[int]:
    (policy,) = [p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == name]
    return [p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]]


def test_egress_takes_the_ports_of_the_configured_addresses() -> None:
    docs = manifests(
        {
            "l2": {"mode": "redis", "redis": {"address": "redis-0:7000,redis-1:7001,redis-2:7000"}},
            "kafka": {"enabled": True, "brokers": "kafka-0:9094,kafka-1:9094"},
        }
    )
    for name in ("rel-hps", "rel-hps-l2-updater"):
        assert _egress_ports(docs, name) == [53, 53, 7000, 7001, 9094], name


def test_the_l2_updaters_metrics_are_scraped() -> None:
    """A Service exposes the l2-updater's metrics port, and the ServiceMonitor selects it."""
    docs = manifests("everything")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    selector = monitor["spec"]["selector"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}

    def selected(labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
            labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
        )

    (l2_updater,) = [
        d
        for d in of_kind(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "l2-updater"
    ]
    pod_labels = l2_updater["spec"]["template"]["metadata"]["labels"]
    (container,) = l2_updater["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"] for p in container["ports"]}
    scraped = [
        s
        for s in of_kind(docs, "Service")
        if selected(s["metadata"]["labels"])
        and s["spec"]["selector"].items() <= pod_labels.items()
        and {p["targetPort"] for p in s["spec"]["ports"]} & container_ports & ports
    ]
    assert [s["metadata"]["name"] for s in scraped] == ["rel-hps-l2-updater"]
    serving = [s for s in of_kind(docs, "Service") if selected(s["metadata"]["labels"])]
    assert "metrics" in {p["name"] for s in serving for p in s["spec"]["ports"]}


def test_the_l2_updater_routes_by_the_versions_the_pods_publish() -> None:
    """Its command follows the pods' version records, and its record's folder (the
    temporary one: /etc/hps is read-only) is a writable volume."""
    (d,) = [
        d
        for d in of_kind(manifests("everything"), "Deployment")
        if "l2-updater" in d["metadata"]["name"]
    ]
    (container,) = d["spec"]["template"]["spec"]["containers"]
    assert "--versions-from-l2" in container["command"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/tmp"].get("readOnly") and mounts["/etc/hps"]["readOnly"]


def test_the_l2_updater_has_a_placement_of_its_own() -> None:
    """The serving pods' GPU nodeSelector and tolerations do not pin the CPU-only consumer."""
    values = profile_values("everything")

    def l2_updater_spec(values: dict[str, Any]) -> dict[str, Any]:
        (d,) = [
            d
            for d in of_kind(manifests(values), "Deployment")
            if "l2-updater" in d["metadata"]["name"]
        ]
        spec: dict[str, Any] = d["spec"]["template"]["spec"]
        return spec

    spec = l2_updater_spec(values)
    assert not {"nodeSelector", "tolerations", "affinity"} & set(spec)
    own = {
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    }
    values["kafka"]["l2Updater"] = {**values["kafka"]["l2Updater"], **own}
    spec = l2_updater_spec(values)
    assert {k: spec[k] for k in own} == own


def test_model_files_from_an_image_are_copied_beside_not_over_them() -> None:
    """The copy init container mounts the model volume apart from the image's files (both
    /models by default) and copies into it; the other containers see it at mountPath."""
    values = profile_values("persistence")
    source = values["modelSource"]
    assert source["image"]["path"] == "/models"
    spec = serving_workload(manifests(values))["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in containers(spec)}
    copy = by_name["model-copy"]
    (mount,) = copy["volumeMounts"]
    assert mount["name"] == "model-source"
    image_path = source["image"]["path"].rstrip("/") + "/"
    target = mount["mountPath"].rstrip("/") + "/"
    assert not image_path.startswith(target) and not target.startswith(image_path)
    assert copy["command"] == ["cp", "-R", f"{source['image']['path']}/.", mount["mountPath"]]
    for name in ("import", "triton"):
        mounts = {m["name"]: m["mountPath"] for m in by_name[name]["volumeMounts"]}
        assert mounts["model-source"] == "/models", name


def _bytes(quantity: str) -> int:
    units = {"Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize(
    ("values", "l3", "models"),
    [
        ({}, "10Gi", "10Gi"),
        ({"l3": {"sizeLimit": "2Gi"}, "modelSource": {"sizeLimit": "512Mi"}}, "2Gi", "512Mi"),
        ({"persistence": {"enabled": True}}, None, "10Gi"),
        ({"modelSource": {"type": "pvc", "pvc": {"existingClaim": "c"}}}, "10Gi", None),
        ({"l3": {"sizeLimit": ""}, "modelSource": {"sizeLimit": ""}}, "", ""),
    ],
)
def test_emptydirs_on_disk_are_bounded_and_requested(
    values: dict[str, Any], l3: str | None, models: str | None
) -> None:
    """L3 and the model files in emptyDirs: sizeLimit each, and the serving container
    requests their sum as ephemeral-storage (the node must have room for both)."""
    spec = serving_workload(manifests(values))["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name, size in (("l3", l3), ("model-source", models)):
        if size is None:
            assert "emptyDir" not in volumes.get(name, {}), name
        else:
            assert volumes[name]["emptyDir"].get("sizeLimit", "") == size, name
    (triton,) = [c for c in spec["containers"] if c["name"] == "triton"]
    requested = triton["resources"]["requests"].get("ephemeral-storage")
    total = sum(_bytes(s) for s in (l3, models) if s)
    assert (_bytes(requested) if requested else 0) == total


LONG_RUNNING = {"triton", "control-plane", "updater"}


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_every_long_running_container_has_liveness_and_readiness(profile: str | None) -> None:
    docs = manifests(profile_values(profile) if profile else {})
    for name, spec in pod_specs(docs):
        if spec.get("restartPolicy") == "Never":
            continue  # the helm test pod runs to completion (bounded by activeDeadlineSeconds)
        for c in spec["containers"]:
            assert c["name"] in LONG_RUNNING, (name, c["name"])
            assert "livenessProbe" in c and "readinessProbe" in c, (name, c["name"])
    (test_pod,) = of_kind(docs, "Pod")
    assert test_pod["spec"]["activeDeadlineSeconds"] > 0


@pytest.mark.parametrize("profile", ["everything", "redis-kafka-gpu"])
def test_updaters_live_by_their_consumer_loop(profile: str) -> None:
    """Every `hps consume`: /healthz on its metrics port, which fails when its loop stalls."""
    from hps.cli import build_parser

    updaters = [
        (name, c)
        for name, spec in pod_specs(manifests(profile))
        for c in spec["containers"]
        if c["command"][:2] == ["hps", "consume"]
    ]
    assert {c["name"] for _, c in updaters} == {"updater"} and len(updaters) == 2
    for name, c in updaters:
        args = build_parser().parse_args([a.replace("$(", "") for a in c["command"][1:]])
        assert args.max_loop_age_s == 60 and args.metrics_address == "0.0.0.0"
        (port,) = [p for p in c["ports"] if p["name"] == "upd-metrics"]
        assert port["containerPort"] == args.metrics_port
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "upd-metrics"}, (name, probe)


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_secrets_are_files_not_environment_values(profile: str | None) -> None:
    docs = manifests(profile_values(profile) if profile else {})
    for name, spec in pod_specs(docs):
        for c in containers(spec):
            for var in c.get("env", []):
                assert "secretKeyRef" not in var.get("valueFrom", {}), (name, c["name"], var)
            assert "envFrom" not in c, (name, c["name"])
        for volume in spec["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] == 0o440, (name, volume["name"])

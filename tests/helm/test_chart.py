"""helm/hps: lint, render and validate every example profile, offline.

Helm's own lint and renderer (the Go SDK bundled by helm-python-sdk), then every rendered
object against the Kubernetes OpenAPI schemas of two releases (kubernetes-validate, strict:
unknown fields fail). ServiceMonitor is a CRD with no schema there; it is the only skip.
"""

from __future__ import annotations

import pytest

from tests.helm.chart import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    PROFILES,
    containers,
    manifests,
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
        assert volumes["l3"] == {"name": "l3", "emptyDir": {}}
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

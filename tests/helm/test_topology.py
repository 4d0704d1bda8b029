"""The rendered pods agree with hps.topology, computed from the ps.json they are given.

For every profile and for each L2 mode with and without Kafka: the updater sidecar and the
L2 updater exist exactly when the topology says `hps consume` applies updates; the L3 writer
of each pod is the one the topology names; /dev/shm is shared by the containers that use a
per-node L2; the import loads L2 only where the topology fills it at import.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hps.config import parse_config
from hps.topology import Topology, topology
from tests.helm.chart import PROFILES, config_files, manifests, profile_values, serving_workload

REDIS = {"mode": "redis", "redis": {"address": "redis:6379", "existingSecret": "r"}}
KAFKA = {"enabled": True, "brokers": "kafka:9092"}
CASES: dict[str, dict[str, Any]] = {
    **{p: profile_values(p) for p in PROFILES},
    "embedded": {"l2": {"mode": "embedded"}},
    "embedded+kafka": {"l2": {"mode": "embedded"}, "kafka": KAFKA},
    "pod": {
        "l2": {"mode": "pod"},
        "models": [{"model": "m", "embedding_vecsize_per_table": [4], "hps_instances": 2}],
    },
    "redis": {"l2": REDIS},
    "redis+kafka": {"l2": REDIS, "kafka": KAFKA},
}


def _topology(files: dict[str, str], name: str, monkeypatch: pytest.MonkeyPatch) -> Topology:
    monkeypatch.setenv("HPS_REDIS_PASSWORD", "x")
    monkeypatch.setenv("HPS_KAFKA_SASL_PASSWORD", "x")
    return topology(parse_config(json.loads(files[name]), name))


@pytest.mark.parametrize("case", list(CASES))
def test_pods_match_topology(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = manifests(CASES[case])
    files = config_files(docs)
    topo = _topology(files, "ps.json", monkeypatch)
    spec = serving_workload(docs)["spec"]["template"]["spec"]
    names = [c["name"] for c in spec["containers"]]
    l2_updaters = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "l2-updater"
    ]

    consumer = topo.updates == "consumer"
    assert ("updater" in names) == consumer, (case, topo.updates)
    assert bool(l2_updaters) == (consumer and topo.l2 == "server"), case
    assert (
        topo.l1_refresh
        == {"none": "none", "embedded": "applier", "consumer": "listener"}[topo.updates]
    )

    # One L3 writer per pod: an embedded serving process, or the sidecar, never both; with
    # updates, exactly one (else the pod's L3 never receives them).
    writers = [m.model for m in topo.models if m.l3_mode == "read_write"]
    assert not (writers and consumer), case
    if topo.l3 and topo.updates == "embedded":
        assert [m.model for m in topo.models] == writers, case
    if consumer:
        assert all(m.l3_mode == "secondary" for m in topo.models)
        assert _topology(files, "ps-updater.json", monkeypatch).l2 is None  # L3 only
        if l2_updaters:
            l2_topo = _topology(files, "ps-l2.json", monkeypatch)
            assert (l2_topo.l2, l2_topo.l3) == ("server", False)

    # A per-node L2 lives in /dev/shm, which every container using it mounts.
    if topo.l2 == "node":
        for c in spec["containers"]:
            if c["name"] in ("triton", "control-plane"):
                assert any(m["mountPath"] == "/dev/shm" for m in c["volumeMounts"])

    imported = _topology(files, "ps-import.json", monkeypatch)
    assert imported.updates == "none" and imported.l3
    fills_at_import = topo.l2_filled_by == "import" and topo.updates == "none"
    assert (imported.l2 == "server") == fills_at_import, case

"""The rendered pods against the real code: ps.json files and command lines.

Every container that runs ``hps`` has its command line parsed by ``hps.cli.build_parser``
(Kubernetes' ``$(VAR)`` expanded from the container's env), and the ps.json it names loads
with ``hps.config`` given exactly the environment variables the container sets, so a secret
named in a ps.json but missing from a container fails here. Secrets arrive as files: each
``*_FILE`` variable must name a file of a Secret volume the container mounts (or Triton's
admin key file, which ``hps serve --state-dir`` of the same pod writes into a volume both
mount), and a stand-in of that file is what the config reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hps.cli import build_parser
from hps.config import parse_config
from tests.helm.chart import (
    PROFILES,
    config_files,
    containers,
    manifests,
    mounted_file,
    pod_specs,
    serving_workload,
)

SECRET = "from-a-kubernetes-secret"


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment; downward-API values stand in as fixed text."""
    return {var["name"]: var.get("value", "pod-0") for var in container.get("env", [])}


def _key_writers(spec: dict[str, Any]) -> dict[str, str]:
    """Volume -> the admin key file ``hps serve --state-dir`` writes into it (this pod's)."""
    from hps.triton.admin_key import KEY_FILE_NAME

    writers = {}
    for c in spec["containers"]:
        if c["command"][:2] == ["hps", "serve"] and "--state-dir" in c["command"]:
            state_dir = c["command"][c["command"].index("--state-dir") + 1].rstrip("/")
            for m in c.get("volumeMounts", []):
                if m["mountPath"].rstrip("/") == state_dir and not m.get("readOnly"):
                    writers[m["name"]] = KEY_FILE_NAME
    return writers


def _secret_env(container: dict[str, Any], spec: dict[str, Any], folder: Path) -> dict[str, str]:
    """The container's environment, each ``*_FILE`` pointed at a stand-in of the Secret file
    it names (which must be a file of a Secret volume mounted into this container, or the
    admin key file that this pod's ``hps serve --state-dir`` writes)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    writers = _key_writers(spec)
    env = _env(container)
    for name, value in env.items():
        if not name.endswith("_FILE"):
            continue
        mounts = [
            m
            for m in container.get("volumeMounts", [])
            if value.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        assert len(mounts) == 1, f"{name}={value}: under no volume the container mounts"
        volume = mounts[0]["name"]
        file = value[len(mounts[0]["mountPath"].rstrip("/")) + 1 :]
        secret = volumes[volume].get("secret")
        if volume in writers and not secret:
            assert file == writers[volume], f"{name}={value}: not the file hps serve writes"
        else:
            assert secret, f"{name}={value}: {volume} is not a Secret volume"
            items = secret.get("items")
            assert items is None or file in {i["path"] for i in items}, f"{name}: no {file}"
        path = folder / mounts[0]["name"] / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SECRET + "\n")  # as `kubectl create secret --from-file` may leave it
        env[name] = str(path)
    return env


def _expand(arg: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


def _hps_containers(profile: str | dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{name}/{c['name']}", c)
        for name, spec in pod_specs(manifests(profile))
        for c in containers(spec)
        if c["command"][0] == "hps"
    ]


@pytest.mark.parametrize("profile", PROFILES)
def test_command_lines_parse(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    seen = set()
    for where, container in _hps_containers(profile):
        env = _env(container)
        argv = [_expand(a, env) for a in container["command"][1:]]
        assert "$(" not in " ".join(argv), f"{where}: unexpanded variable in {argv}"
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `hps {' '.join(argv)}` does not parse")
        seen.add(args.command)
        if args.command == "consume" and "--group-id" in argv:
            assert args.group_id.endswith("-pod-0"), where  # one group per pod
    assert {"serve", "import", "admin"} <= seen


@pytest.mark.parametrize(("value", "parsed"), [(None, None), (0, 0.0), (2.5, 2.5)])
def test_the_request_size_gate_limit_reaches_hps_serve(value: float | None, parsed: float) -> None:
    values = {} if value is None else {"triton": {"maxRequestMb": value}}
    serve = [c for _, c in _hps_containers(values) if c["command"][1] == "serve"]
    assert serve
    for container in serve:
        assert build_parser().parse_args(container["command"][1:]).max_request_mb == parsed


def test_admin_command() -> None:
    """The control-plane sidecar's command line, against the real `hps admin` parser."""
    parser = build_parser()
    for profile in PROFILES:
        for where, container in _hps_containers(profile):
            if container["command"][1] == "admin":
                args = parser.parse_args(container["command"][1:])
                assert args.command == "admin", where


REDIS = {"mode": "redis", "redis": {"address": "r:6379", "existingSecret": "r"}}
KAFKA = {
    "enabled": True,
    "brokers": "k:9092",
    "existingSecret": "k",
    "secretKeys": {"sasl.password": "pw"},
}
KAFKA_TLS = {
    **KAFKA,
    "config": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
    "tls": {"existingSecret": "kafka-tls", "clientCertificate": True},
}
CASES: dict[str, Any] = {
    **{p: p for p in PROFILES},
    "pod-local L2": {"l2": {"mode": "pod"}},
    "redis without kafka": {"l2": REDIS},
    "embedded with kafka": {"kafka": KAFKA},
    "redis with kafka": {"l2": REDIS, "kafka": KAFKA},
    "redis with kafka over TLS": {"l2": REDIS, "kafka": KAFKA_TLS},
    "admin token": {"admin": {"existingSecret": "a"}},
    "admin key pinned": {"admin": {"existingSecret": "a", "pinAdminKey": True}},
}


def _config_readers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(pod/container, container, the ps.json path it reads) of every container given
    ``--config``: the hps commands and the helm test pod's script alike."""
    return [
        (f"{name}/{c['name']}", c, c["command"][c["command"].index("--config") + 1])
        for name, spec in pod_specs(docs)
        for c in containers(spec)
        if "--config" in c["command"]
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_config_files_load(case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    profile = CASES[case]
    docs = manifests(profile)
    specs = dict(pod_specs(docs))
    used = set()
    readers = _config_readers(docs)
    assert any(c["command"][0] == "python3" for _, c, _ in readers)  # the helm test pod
    for where, container, path in readers:
        for var in container.get("env", []):
            assert "secretKeyRef" not in var.get("valueFrom", {}), f"{where}: {var['name']}"
        spec = specs[where.split("/")[0]]
        text = mounted_file(docs, spec, container, path)
        used.add(path)
        assert SECRET not in text
        env = _secret_env(container, spec, tmp_path / where)
        with monkeypatch.context() as m:
            for var in (
                "HPS_REDIS_PASSWORD",
                *[k.removesuffix("_FILE") for k in env if k.startswith("HPS_")],
                *[k for k in env if k.startswith("HPS_")],
            ):
                m.delenv(var, raising=False)
            for var, value in env.items():
                m.setenv(var, value)
            config = parse_config(json.loads(text), f"{where}:{path}")
        if config.volatile_db.type in ("redis", "redis_cluster") and "hps_password_env" in text:
            assert config.volatile_db.password == SECRET
        for key, setting in config.update_source.hps_kafka_config.items():
            assert "password" not in key or setting == SECRET
    files = {f"/etc/hps/{name}" for name in config_files(docs)}
    assert files <= used, f"ConfigMap files nobody reads: {files - used}"


def test_roles_split_tiers() -> None:
    """Redis + Kafka: the import and the per-pod updater touch L3 only, the L2 updater L2 only."""
    files = {k: json.loads(v) for k, v in config_files(manifests("redis-kafka-gpu")).items()}
    assert files["ps.json"]["volatile_db"]["type"] == "redis_cluster"
    assert files["ps.json"]["persistent_db"]["type"] == "rocks_db"
    assert files["ps-import.json"]["volatile_db"]["type"] == "disabled"
    assert files["ps-import.json"]["update_source"]["type"] == "null"
    assert files["ps-updater.json"]["volatile_db"]["type"] == "disabled"
    assert files["ps-l2.json"]["persistent_db"]["type"] == "disabled"
    assert files["ps-l2.json"]["volatile_db"]["type"] == "redis_cluster"
    groups = {f["update_source"]["hps_group_id"] for n, f in files.items() if n != "ps-import.json"}
    assert groups == {"hps-test-rel-hps-l2"}  # the serving L1 listeners follow the L2 group


REDIS_KAFKA = {"l2": {"mode": "redis", "redis": {"address": "r:6379"}}, "kafka": KAFKA}


def _groups(values: dict[str, Any], namespace: str = "hps-test") -> tuple[str, str]:
    """(the L2 group of ps.json, the updater sidecar's --group-id) as rendered."""
    docs = manifests(values, namespace)
    l2 = json.loads(config_files(docs)["ps.json"])["update_source"]["hps_group_id"]
    spec = serving_workload(docs)["spec"]["template"]["spec"]
    (updater,) = [c for c in spec["containers"] if c["name"] == "updater"]
    return l2, updater["command"][updater["command"].index("--group-id") + 1]


def test_consumer_groups_name_the_namespace_by_default() -> None:
    """Releases of one name in two namespaces sharing a Kafka cluster must not share a
    group: each would get part of the partitions and apply only that part."""
    assert _groups(REDIS_KAFKA) == ("hps-test-rel-hps-l2", "hps-test-rel-hps-l3-$(POD_NAME)")
    assert set(_groups(REDIS_KAFKA, "other")).isdisjoint(_groups(REDIS_KAFKA))


def test_kafka_group_id_names_both_groups() -> None:
    values = {**REDIS_KAFKA, "kafka": {**KAFKA, "groupId": "ctr-serving"}}
    assert _groups(values) == ("ctr-serving", "ctr-serving-l3-$(POD_NAME)")


@pytest.mark.parametrize(
    ("triton", "extra", "segment"),
    [
        ({}, {}, 2**30 - 256 * 2**20),  # shmSize 1Gi less the Python backend's 256Mi
        ({"shmSize": "4Gi", "pythonBackendShm": "512Mi"}, {}, 4 * 2**30 - 512 * 2**20),
        ({"shmSize": "2Gi"}, {"shared_memory_size": 2**30}, 2**30),
    ],
)
def test_the_pod_l2_segment_fits_in_dev_shm(
    triton: dict[str, Any], extra: dict[str, Any], segment: int
) -> None:
    """l2.mode=pod: the segment is /dev/shm less what Triton's Python backend keeps there,
    not hps's own default (16 GiB, far beyond the memory-backed volume)."""
    from hps.topology import topology

    docs = manifests({"l2": {"mode": "pod", "extra": extra}, "triton": triton})
    config = parse_config(json.loads(config_files(docs)["ps.json"]), "ps.json")
    assert topology(config).l2 == "node"
    assert config.volatile_db.shared_memory_size == segment


@pytest.mark.parametrize("client", [False, True], ids=["ca", "client certificate"])
@pytest.mark.parametrize("l2", [{}, REDIS], ids=["embedded", "redis"])
def test_kafka_tls_files_are_mounted_where_the_config_names_them(
    l2: dict[str, Any], client: bool
) -> None:
    """kafka.tls.existingSecret: every container whose ps.json reads Kafka mounts that
    Secret read-only (group-readable), and its ssl.*.location settings name the Secret's
    files there; the containers without Kafka mount nothing of it."""
    kafka = {**KAFKA_TLS, "tls": {"existingSecret": "kafka-tls", "clientCertificate": client}}
    docs = manifests({"l2": l2, "kafka": kafka})
    specs = dict(pod_specs(docs))
    want = {"ssl.ca.location": "ca.crt"}
    if client:
        want |= {"ssl.certificate.location": "tls.crt", "ssl.key.location": "tls.key"}
    kafka_readers = []
    for where, container, path in _config_readers(docs):
        spec = specs[where.split("/")[0]]
        volumes = {v["name"]: v for v in spec["volumes"]}
        source = json.loads(mounted_file(docs, spec, container, path))["update_source"]
        secrets = {
            m["name"]: m
            for m in container.get("volumeMounts", [])
            if volumes[m["name"]].get("secret", {}).get("secretName") == "kafka-tls"
        }
        if source["type"] == "null":
            assert not secrets, where
            continue
        kafka_readers.append(where)
        settings = source["hps_kafka_config"]
        assert {k for k in settings if k.endswith(".location")} == set(want), where
        assert settings["security.protocol"] == "SASL_SSL", where  # kafka.config kept
        for setting, key in want.items():
            (mount,) = [
                m
                for m in secrets.values()
                if settings[setting].startswith(m["mountPath"].rstrip("/") + "/")
            ]
            assert mount["readOnly"] is True, where
            secret = volumes[mount["name"]]["secret"]
            assert secret["defaultMode"] == 0o440, where
            file = settings[setting][len(mount["mountPath"].rstrip("/")) + 1 :]
            assert {"key": key, "path": file} in secret["items"], (where, setting)
    assert {w.split("/")[-1] for w in kafka_readers} == (
        {"triton", "control-plane", "updater"} if l2 else {"triton", "control-plane"}
    )


def test_model_files_are_relative_to_the_model_source() -> None:
    """Every file a model names, hps_cache's frequency_file and warmup_keyset too, is read
    under modelSource.mountPath unless absolute (the processes' cwd is /tmp, a scratch
    volume); {model} and {table} stay for the serving process to fill in."""
    model = {
        "model": "m",
        "sparse_files": ["tables/a", "/abs/b"],
        "dense_file": "dense.npz",
        "network_file": "/abs/net.json",
        "embedding_table_names": ["a", "b"],
        "embedding_vecsize_per_table": [4, 4],
        "hps_cache": {
            "policy": "frequency",
            "frequency_file": "freq/{model}.{table}.npz",
            "warmup_keyset": "/abs/{table}.keys",
        },
    }
    other = {**model, "model": "n", "hps_cache": {"warmup_keyset": "keys/{model}-{table}"}}
    docs = manifests({"models": [model, other], "modelSource": {"mountPath": "/data"}})
    for name, text in config_files(docs).items():
        config = parse_config(json.loads(text), name)
        m, n = config.models
        assert m.sparse_files == ["/data/tables/a", "/abs/b"], name
        assert (m.dense_file, m.network_file) == ("/data/dense.npz", "/abs/net.json"), name
        assert m.hps_cache.frequency_file == "/data/freq/{model}.{table}.npz", name
        assert m.hps_cache.warmup_keyset == "/abs/{table}.keys", name
        assert (n.hps_cache.frequency_file, n.hps_cache.warmup_keyset) == (
            None,
            "/data/keys/{model}-{table}",
        ), name


def _quantity(size: str | int) -> float:
    units = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number = re.match(r"[0-9.]+", str(size))
    assert number
    return float(number[0]) * units[str(size)[number.end() :]]


@pytest.mark.parametrize(
    ("values", "staged_gb"),
    [
        *[(p, None) for p in PROFILES],
        ({}, 4.0),  # 40% of the default 10Gi
        ({"l3": {"sizeLimit": "2Gi"}}, 0.8),
        ({"l3": {"sizeLimit": ""}}, 4.0),  # unbounded: nothing to take 40% of
        ({"persistence": {"enabled": True, "size": "100Gi"}}, 40.0),
        ({"controlPlane": {"maxStagedGb": 9.5}}, 9.5),
        ({"controlPlane": {"maxStagedGb": 16}, "l3": {"sizeLimit": "20G"}}, 16.0),
        ({"controlPlane": {"maxStagedGb": 16}, "persistence": {"enabled": True}}, None),
    ],
)
def test_the_control_planes_uploads_fit_on_the_l3_volume(
    values: str | dict[str, Any], staged_gb: float | None
) -> None:
    """hps admin stages uploads under its --state-dir, on the L3 volume beside RocksDB: its
    --max-staged-gb (hps's own default: 64 GiB) must be below that volume's size, or an
    upload fills the volume (the pod evicted, L3 lost) instead of getting 413 / 429."""
    import helm_python as helm

    try:
        workload = serving_workload(manifests(values))
    except helm.HelmError as err:
        assert staged_gb is None and "controlPlane.maxStagedGb (16 GiB)" in str(err)
        assert "persistence.size (10Gi)" in str(err)
        return
    spec = workload["spec"]["template"]["spec"]
    (admin,) = [c for c in spec["containers"] if c["name"] == "control-plane"]
    args = build_parser().parse_args(admin["command"][1:])
    (mount,) = [m for m in admin["volumeMounts"] if args.state_dir.startswith(m["mountPath"] + "/")]
    assert mount["name"] == "l3"
    volume = {v["name"]: v for v in spec["volumes"]}.get("l3")
    if volume is None:  # persistence: the StatefulSet's claim
        (claim,) = workload["spec"]["volumeClaimTemplates"]
        size = claim["spec"]["resources"]["requests"]["storage"]
    else:
        size = volume["emptyDir"].get("sizeLimit", "")
    if size != "":
        assert args.max_staged_gb * 2**30 < _quantity(size)
    if staged_gb is not None:
        assert args.max_staged_gb == pytest.approx(staged_gb, abs=1e-3)

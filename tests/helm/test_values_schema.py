"""values.schema.json (and the chart's cross-value checks) refuse bad values, naming them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import PROFILES, chart, profile_values, render

# (values, words the message must contain: the value's path and what is wrong)
BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    ("negative replicas", {"replicaCount": -1}, ["/replicaCount", "minimum"]),
    ("replicas as text", {"replicaCount": "three"}, ["/replicaCount", "string"]),
    ("unknown top-level key", {"replicas": 2}, ["'replicas' not allowed"]),
    ("typo in a section", {"triton": {"httpport": 8000}}, ["/triton", "'httpport' not allowed"]),
    (
        "inline Redis password",
        {"l2": {"mode": "redis", "redis": {"address": "r:6379", "password": "hunter2"}}},
        ["/l2/redis", "'password' not allowed"],
    ),
    (
        "Redis password through extra",
        {"l2": {"extra": {"password": "hunter2"}}},
        ["/l2/extra/password"],
    ),
    (
        "inline Kafka SASL password",
        {"kafka": {"config": {"sasl.password": "hunter2"}}},
        ["/kafka/config/sasl.password"],
    ),
    (
        "inline Kafka key passphrase",
        {"kafka": {"config": {"sasl.oauthbearer.assertion.private.key.passphrase": "pp"}}},
        ["/kafka/config/sasl.oauthbearer.assertion.private.key.passphrase"],
    ),
    (
        "inline Kafka private key",
        {"kafka": {"config": {"sasl.oauthbearer.assertion.private.key.pem": "-----BEGIN"}}},
        ["/kafka/config/sasl.oauthbearer.assertion.private.key.pem"],
    ),
    (
        "inline Redis password in the environment",
        {"triton": {"extraEnv": [{"name": "HPS_REDIS_PASSWORD", "value": "hunter2"}]}},
        ["/triton/extraEnv/0"],
    ),
    (
        "inline admin key in the environment",
        {"triton": {"extraEnv": [{"name": "HPS_ADMIN_KEY", "value": "k" * 20}]}},
        ["/triton/extraEnv/0"],
    ),
    (
        "unknown L2 mode",
        {"l2": {"mode": "memcached"}},
        ["/l2/mode", "one of 'embedded', 'pod', 'redis'"],
    ),
    ("Redis without address", {"l2": {"mode": "redis"}}, ["/l2/redis/address", "minLength"]),
    (
        "Redis address without port",
        {"l2": {"mode": "redis", "redis": {"address": "redis.svc"}}},
        ["/l2/redis/address", "pattern"],
    ),
    ("Kafka without brokers", {"kafka": {"enabled": True}}, ["/kafka/brokers", "minLength"]),
    ("port out of range", {"triton": {"httpPort": 70000}}, ["/triton/httpPort", "maximum"]),
    ("GPU count zero", {"triton": {"gpu": {"enabled": True, "count": 0}}}, ["/triton/gpu/count"]),
    ("bad digest", {"images": {"hps": {"digest": "latest"}}}, ["/images/hps/digest", "pattern"]),
    (
        "model without vector sizes",
        {"models": [{"model": "m"}]},
        ["/models/0", "embedding_vecsize"],
    ),
    (
        "bad model name",
        {"models": [{"model": "a b", "embedding_vecsize_per_table": [4]}]},
        ["/models/0/model", "pattern"],
    ),
    (
        "PVC source without claim",
        {"modelSource": {"type": "pvc"}},
        ["/modelSource/pvc/existingClaim"],
    ),
    ("bad memory quantity", {"triton": {"shmSize": "lots"}}, ["/triton/shmSize"]),
    # Kubernetes reads the suffix m as milli (256m: 0.256 bytes), not Docker's MiB
    ("Docker's 256m for /dev/shm", {"triton": {"shmSize": "256m"}}, ["/triton/shmSize"]),
    (
        "milli-bytes for the Python backend",
        {"triton": {"pythonBackendShm": "256m"}},
        ["/triton/pythonBackendShm"],
    ),
    (
        "milli-bytes for the L3 claim",
        {"persistence": {"enabled": True, "size": "10m"}},
        ["/persistence/size"],
    ),
    (
        "typo in a model key",
        {"models": [{"model": "m", "embedding_vecsize_per_table": [4], "hps_instance": 2}]},
        ["/models/0", "'hps_instance' not allowed"],
    ),
    (
        "typo in a model's hps_cache",
        {
            "models": [
                {"model": "m", "embedding_vecsize_per_table": [4], "hps_cache": {"polcy": "lfu"}}
            ]
        },
        ["/models/0/hps_cache", "'polcy' not allowed"],
    ),
    ("typo in l2.extra", {"l2": {"extra": {"num_partition": 64}}}, ["'num_partition' not allowed"]),
    ("typo in l3.extra", {"l3": {"extra": {"num_thread": 8}}}, ["'num_thread' not allowed"]),
    (
        "typo in kafka.extra",
        {"kafka": {"extra": {"poll_timeout": 100}}},
        ["'poll_timeout' not allowed"],
    ),
    # keys the chart sets itself: its value would win the merge and drop the user's silently
    (
        "dead-letter topic through kafka.extra",
        {"kafka": {"extra": {"hps_dead_letter_topic": "dlq"}}},
        ["/kafka/extra/hps_dead_letter_topic"],
    ),
    *[
        (f"Redis TLS through l2.extra.{key}", {"l2": {"extra": {key: value}}}, [f"/l2/extra/{key}"])
        for key, value in [
            ("enable_tls", False),
            ("tls_ca_certificate", "/ca.crt"),
            ("tls_client_certificate", "/tls.crt"),
            ("tls_client_key", "/tls.key"),
            ("tls_server_name_identification", "redis"),
        ]
    ],
    (
        "HPA above 100%",
        {"autoscaling": {"targetCPUUtilizationPercentage": 150}},
        ["/autoscaling/targetCPUUtilizationPercentage", "maximum"],
    ),
    ("bad secret name", {"admin": {"existingSecret": "Not_A_Name"}}, ["/admin/existingSecret"]),
    (
        "typo in Kafka TLS",
        {"kafka": {"tls": {"caSecret": "ca"}}},
        ["/kafka/tls", "'caSecret' not allowed"],
    ),
    (
        "no room for uploads",
        {"controlPlane": {"maxStagedGb": 0}},
        ["/controlPlane/maxStagedGb", "exclusiveMinimum"],
    ),
]

# Refused while rendering, by the chart's own checks (templates/_validate.tpl).
BAD_RENDER: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "pod-local L2 with Kafka",
        {"l2": {"mode": "pod"}, "kafka": {"enabled": True, "brokers": "k:9092"}},
        ["l2.mode=pod", "kafka.enabled=true"],
    ),
    (
        "one update stream per node",
        {
            "l2": {"mode": "redis", "redis": {"address": "r:6379"}},
            "kafka": {"enabled": True, "brokers": "k:9092", "extra": {"hps_l1_refresh": "journal"}},
        },
        ["kafka.extra.hps_l1_refresh=journal", "each serving process listens"],
    ),
    (
        "HPA min above max",
        {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        ["autoscaling.minReplicas (5)", "autoscaling.maxReplicas (2)"],
    ),
    (
        "secret keys without a secret",
        {"kafka": {"secretKeys": {"sasl.password": "pw"}}},
        ["kafka.secretKeys", "kafka.existingSecret"],
    ),
    (
        "Kafka CA set in kafka.config beside the mounted one",
        {
            "kafka": {
                "enabled": True,
                "brokers": "k:9093",
                "config": {"ssl.ca.location": "/etc/hps/kafka-ca/ca.crt"},
                "tls": {"existingSecret": "kafka-tls"},
            }
        },
        ["kafka.config.ssl.ca.location", "kafka.tls.existingSecret", "/hps-kafka-tls/ca.crt"],
    ),
    (
        "Kafka client key set in kafka.config beside the mounted one",
        {
            "kafka": {
                "enabled": True,
                "brokers": "k:9093",
                "config": {"ssl.key.location": "/keys/tls.key"},
                "tls": {"existingSecret": "kafka-tls", "clientCertificate": True},
            }
        },
        ["kafka.config.ssl.key.location", "/hps-kafka-tls/tls.key"],
    ),
    (
        "Kafka client certificate without its Secret",
        {"kafka": {"enabled": True, "brokers": "k:9093", "tls": {"clientCertificate": True}}},
        ["kafka.tls.clientCertificate=true", "kafka.tls.existingSecret"],
    ),
    (
        "Kafka CA file's content as its path",
        {
            "kafka": {
                "enabled": True,
                "brokers": "k:9093",
                "existingSecret": "k",
                "secretKeys": {"ssl.ca.location": "ca.crt"},
            }
        },
        ["kafka.secretKeys.ssl.ca.location", "kafka.tls.existingSecret"],
    ),
    (
        "uploads as large as the L3 emptyDir",
        {"controlPlane": {"maxStagedGb": 10}},
        ["controlPlane.maxStagedGb (10 GiB)", "l3.sizeLimit (10Gi)"],
    ),
    (
        "uploads larger than the L3 emptyDir in bytes",
        {"controlPlane": {"maxStagedGb": 2}, "l3": {"sizeLimit": 2 * 10**9}},
        ["controlPlane.maxStagedGb (2 GiB)", "l3.sizeLimit (2000000000 bytes)"],
    ),
    (
        "uploads larger than the L3 claim",
        {"controlPlane": {"maxStagedGb": 64}, "persistence": {"enabled": True, "size": "50G"}},
        ["controlPlane.maxStagedGb (64 GiB)", "persistence.size (50G)"],
    ),
    (
        "admin key pinned without its Secret",
        {"admin": {"pinAdminKey": True}},
        ["admin.pinAdminKey=true", "admin.existingSecret"],
    ),
    (
        "duplicate model",
        {"models": [{"model": "m", "embedding_vecsize_per_table": [4]}] * 2},
        ['model "m" appears twice'],
    ),
    (
        "embedded L2 and Kafka with several instances (no L3 writer)",
        {
            "kafka": {"enabled": True, "brokers": "k:9092"},
            "models": [{"model": "m", "embedding_vecsize_per_table": [4], "hps_instances": 2}],
        },
        ["l2.mode=embedded", "kafka.enabled=true", '"m"', "hps_instances=2", "L3"],
    ),
    (
        "pod-local L2 without room in /dev/shm",
        {"l2": {"mode": "pod"}, "triton": {"shmSize": "256Mi"}},
        ["l2.mode=pod", "triton.shmSize (256Mi)", "triton.pythonBackendShm (256Mi)"],
    ),
    (
        "pod-local L2 segment larger than /dev/shm",
        {"l2": {"mode": "pod", "extra": {"shared_memory_size": 2**30}}},
        ["l2.extra.shared_memory_size (1073741824 bytes)", "triton.shmSize (1Gi)"],
    ),
    (
        "ServiceMonitor that the NetworkPolicy keeps out",
        {"serviceMonitor": {"enabled": True}},
        ["serviceMonitor.enabled=true", "networkPolicy.monitoring", "networkPolicy.enabled"],
    ),
    (
        "dead letters sent to an update topic",
        {"kafka": {"enabled": True, "brokers": "k:9092", "deadLetterTopic": "hps_et.demo.C1"}},
        ['kafka.deadLetterTopic "hps_et.demo.C1"', "name of an update topic"],
    ),
    (
        "consumer loop age below two polls",
        {
            "l2": {"mode": "redis", "redis": {"address": "r:6379"}},
            "kafka": {"enabled": True, "brokers": "k:9092", "extra": {"poll_timeout_ms": 30000}},
        },
        ["kafka.maxLoopAgeSeconds (60)", "kafka.extra.poll_timeout_ms 30 s"],
    ),
    (
        "control plane on Triton's HTTP port",
        {"controlPlane": {"port": 8000}},
        ["controlPlane.port (8000)", "triton.httpPort"],
    ),
    (
        "updater metrics on Triton's metrics port",
        {
            "l2": {"mode": "redis", "redis": {"address": "r:6379"}},
            "kafka": {"enabled": True, "brokers": "k:9092", "updater": {"metricsPort": 8002}},
        },
        ["kafka.updater.metricsPort (8002)", "triton.metricsPort"],
    ),
    *[
        (
            f"model files mounted at {path}",
            {"modelSource": {"mountPath": path}},
            [f"modelSource.mountPath {path}", f"collides with {taken}"],
        )
        for path, taken in [
            ("/tmp", "/tmp"),
            ("/etc/hps", "/etc/hps"),
            ("/var/lib/hps/l3", "/var/lib/hps/l3"),
            ("/var/lib/hps/l3/models", "/var/lib/hps/l3"),
            ("/var/lib/hps", "/var/lib/hps/l3"),
            ("/dev/shm/", "/dev/shm"),
            ("/var/run/hps-admin", "/var/run/hps-admin"),
            ("/opt/hps", "/opt/hps"),
        ]
    ],
    (
        "model image's files where the copy mounts the model volume",
        {"modelSource": {"type": "image", "image": {"repository": "m", "path": "/hps-models"}}},
        ["modelSource.image.path /hps-models", "copy init container"],
    ),
]


@pytest.mark.parametrize(("values", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_schema_refuses(values: dict[str, Any], words: list[str]) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError) as err:
        chart().validate_schema(values)
    for word in words:
        assert word in str(err.value), str(err.value)
    with pytest.raises(helm.HelmError):  # rendering applies the same schema
        render(values)


@pytest.mark.parametrize(
    ("values", "words"), [b[1:] for b in BAD_RENDER], ids=[b[0] for b in BAD_RENDER]
)
def test_render_refuses(values: dict[str, Any], words: list[str]) -> None:
    import helm_python as helm

    chart().validate_schema(values)  # each value alone is fine; together they are not
    with pytest.raises(helm.HelmError) as err:
        render(values)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_kafka_config_refuses_the_names_hps_redacts() -> None:
    """One decision: the schema's pattern is hps.redact's, and what it refuses and lets
    through is what hps.redact calls secret or not."""
    import json
    import re

    from hps.redact import is_secret_name, reference_name_regex, secret_name_regex
    from tests.helm.chart import CHART

    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["kafka"]["properties"]["config"]
    assert list(config["patternProperties"]) == [secret_name_regex()]
    env = schema["properties"]["triton"]["properties"]["extraEnv"]["items"]["if"]
    assert env["properties"]["name"]["pattern"] == secret_name_regex()
    assert env["properties"]["name"]["not"]["pattern"] == reference_name_regex()
    names = ["sasl.password", "ssl.keystore.password", "ssl.key.pem", "sasl.jaas.config",
             "sasl.oauthbearer.client.secret", "acks", "sasl.username", "security.protocol",
             "ssl.ca.location", "ssl.certificate.pem", "sasl.mechanism", "HPS_ADMIN_KEY",
             "HPS_ADMIN_KEY_FILE", "HPS_REDIS_PASSWORD", "Sasl.Password"]  # fmt: skip
    for name in names:
        secret = bool(re.search(secret_name_regex(), name))
        assert (secret and not re.search(reference_name_regex(), name)) == is_secret_name(name)
    chart().validate_schema({"kafka": {"config": {"sasl.username": "u", "acks": "all"}}})
    chart().validate_schema({"triton": {"extraEnv": [  # where a secret is, or from a Secret
        {"name": "HPS_REDIS_PASSWORD_FILE", "value": "/var/run/secrets/pw"},
        {"name": "HPS_ADMIN_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "OMP_NUM_THREADS", "value": "2"},
    ]}})  # fmt: skip


def test_at_least_ten_refusals() -> None:
    assert len(BAD) + len(BAD_RENDER) >= 10


@pytest.mark.parametrize("profile", PROFILES)
def test_profiles_accepted(profile: str) -> None:
    chart().validate_schema(profile_values(profile))


def test_service_monitor_with_monitoring_allowed() -> None:
    """Scraping passes the NetworkPolicy once monitoring names who scrapes, or without it."""
    monitoring = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    render({"serviceMonitor": {"enabled": True}, "networkPolicy": {"monitoring": monitoring}})
    render({"serviceMonitor": {"enabled": True}, "networkPolicy": {"enabled": False}})


@pytest.mark.parametrize(
    "topic",
    [
        "hps_et.demo.C1",
        "hps_et.m-1.t_2",
        "hps_et.dead_letter",
        "hps_et.a.b.c",
        "dlq",
        "x.hps_et.a.b",
    ],
)
def test_dead_letter_topic_refused_as_hps_config_refuses_it(topic: str) -> None:
    """The chart's check is hps.config's: UPDATE_TOPIC_RE, the whole name."""
    import helm_python as helm

    from hps.config.update_source import UPDATE_TOPIC_RE

    values = {"kafka": {"enabled": True, "brokers": "k:9092", "deadLetterTopic": topic}}
    if UPDATE_TOPIC_RE.fullmatch(topic):
        with pytest.raises(helm.HelmError, match="name of an update topic"):
            render(values)
    else:
        render(values)


@pytest.mark.parametrize(
    ("max_age", "poll_ms"),
    [(11, 500), (11, 5000), (11, 5001), (12, 5500), (11, 5500), (60, 29999), (60, 30000)],
)
def test_loop_age_refused_as_hps_consume_refuses_it(max_age: int, poll_ms: int) -> None:
    """hps consume refuses --max-loop-age-s not above 2 x max(poll_timeout_ms, the back-off):
    the chart refuses the same values, before the pods would crash-loop on them."""
    import helm_python as helm

    from hps.updates.consumer import MAX_BACKOFF_S

    values = {
        "l2": {"mode": "redis", "redis": {"address": "r:6379"}},
        "kafka": {
            "enabled": True,
            "brokers": "k:9092",
            "maxLoopAgeSeconds": max_age,
            "extra": {"poll_timeout_ms": poll_ms},
        },
    }
    if max_age <= 2 * max(poll_ms / 1000, MAX_BACKOFF_S):
        with pytest.raises(helm.HelmError, match="kafka.maxLoopAgeSeconds"):
            render(values)
    else:
        render(values)


def _schema() -> dict[str, Any]:
    import json

    from tests.helm.chart import CHART

    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def test_ps_json_keys_are_hps_configs() -> None:
    """models[] and *.extra take exactly the keys hps.config takes (others are refused):
    the schema's lists follow the pydantic models."""
    from hps.config.databases import PersistentDBConfig, VolatileDBConfig
    from hps.config.model import CacheConfig, ModelConfig
    from hps.config.update_source import UpdateSourceConfig

    props = _schema()["properties"]
    deprecated = {"max_get_batch_size", "max_set_batch_size"}  # renamed by hps.config
    model = props["models"]["items"]
    extra = {name: props[name]["properties"]["extra"] for name in ("l2", "l3", "kafka")}
    sections = {
        # version: set by `hps versions`, which a ps.json may not (hps.config.ps._set_by_hps)
        "models[]": (model, set(ModelConfig.model_fields) - {"version"}),
        "models[].hps_cache": (model["properties"]["hps_cache"], set(CacheConfig.model_fields)),
        "l2.extra": (extra["l2"], {*VolatileDBConfig.model_fields, *deprecated}),
        "l3.extra": (extra["l3"], {*PersistentDBConfig.model_fields, *deprecated}),
        "kafka.extra": (extra["kafka"], set(UpdateSourceConfig.model_fields)),
    }
    for name, (section, fields) in sections.items():
        assert section["additionalProperties"] is False, name
        assert set(section["properties"]) == fields, name


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = (
            _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
        )
    return out


@pytest.mark.parametrize(
    ("profile", "over"),
    [
        ("everything", {"l2": {"redis": {"tls": {"clientCertificate": True}}}}),
        ("single-pod", {"l2": {"mode": "pod"}, "triton": {"shmSize": "1Gi"}}),
    ],
)
def test_extra_cannot_set_what_the_chart_sets(profile: str, over: dict[str, Any]) -> None:
    """Every key the chart writes into volatile_db, persistent_db and update_source is refused
    in l2.extra, l3.extra and kafka.extra (the chart's value would win the merge), except
    shared_memory_size, which the chart takes from l2.extra (hps.l2SegmentBytes)."""
    import json

    from tests.helm.chart import config_files, manifests

    values = _merged(profile_values(profile), over)
    props = _schema()["properties"]
    extras = {
        "volatile_db": ("l2", props["l2"]["properties"]["extra"]["properties"]),
        "persistent_db": ("l3", props["l3"]["properties"]["extra"]["properties"]),
        "update_source": ("kafka", props["kafka"]["properties"]["extra"]["properties"]),
    }
    chart_keys: set[tuple[str, str]] = set()
    for text in config_files(manifests(values)).values():
        ps = json.loads(text)
        for section, (name, _) in extras.items():
            given = values.get(name, {}).get("extra") or {}
            chart_keys |= {(section, k) for k in ps[section] if k not in given}
    if profile == "everything":  # Redis with TLS and a client certificate, Kafka
        assert {("volatile_db", "tls_client_key"), ("update_source", "hps_dead_letter_topic")} <= (
            chart_keys
        )
    for section, key in sorted(chart_keys - {("volatile_db", "shared_memory_size")}):
        schema = extras[section][1]
        assert schema[key].get("not") == {}, f"{section}.{key} is set by the chart"

"""No secret in sight: `hps serve`, `hps consume` and `hps admin` started with known secrets,
exercised, and every log line, error body, /metrics, /v1/config and `hps plan` searched.

The secrets: Triton's admin key ($HPS_ADMIN_KEY), the control plane's bearer token
($HPS_ADMIN_TOKEN), the Redis password (a real redis-server with ``requirepass``, the shared
L2) and the Kafka client's ``ssl.keystore.password``, ``sasl.oauthbearer.config`` and
``sasl.password`` (set, unused by the plaintext connection to the real Tansu broker). Each
process starts once; `hps serve` runs verbose, so Triton's and the models' own log lines are
relayed too. Zero hits allowed, and the requests prove the secrets were in use.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hps.net import free_port
from hps.redact import REDACTED
from hps.testing.kafka import TansuBroker
from hps.testing.redis import RedisNode
from tests.fixtures.kafka import FAST_GROUP
from tests.fixtures.triton import write_tables

pytestmark = pytest.mark.integration

HPS = [sys.executable, "-m", "hps.cli"]
MODEL = "sec"
TABLES = {MODEL: [("t", 4, 200)]}
START_TIMEOUT_S = 180.0  # Triton's start on a busy 2-core machine takes 20-60 s


def _secret(label: str) -> str:
    return f"{label}-{secrets.token_hex(12)}"


SECRETS = {
    "admin key": _secret("adminKey"),
    "control-plane token": _secret("cpToken"),
    "redis password": _secret("redisPw"),
    "ssl.keystore.password": _secret("keystorePw"),
    "sasl.oauthbearer.config": "clientId=hps clientSecret=" + _secret("oauthSecret"),
    "sasl.password": _secret("saslPw"),
}


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Stack:
    root: Path
    ps_json: Path
    http: str  # Triton's HTTP address (through the request-size gate)
    triton_metrics: str
    admin: str  # the control plane's URL
    consume_metrics: str
    procs: list[Proc]


def _start(name: str, args: list[str], cwd: Path, env: dict[str, str]) -> Proc:
    log = cwd / f"{name}.log"
    with open(log, "wb") as out:  # stdout and stderr: everything the process says
        proc = subprocess.Popen(
            [*HPS, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Proc(name, proc, log)


def _wait(proc: Proc, ready: Any, what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{proc.name}: no {what}:\n{proc.log.read_text()[-4000:]}")
        time.sleep(0.3)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: Proc) -> None:
    if proc.proc.poll() is None:
        proc.proc.send_signal(signal.SIGTERM)
    try:
        proc.proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.proc.kill()
        proc.proc.wait()


def _ps_json(root: Path, redis: RedisNode, kafka: TansuBroker) -> dict[str, Any]:
    suffix = secrets.token_hex(4)
    return {
        "models": [
            {
                "model": MODEL,
                "sparse_files": [str(root / "tables" / MODEL / "t")],
                "embedding_table_names": ["t"],
                "embedding_vecsize_per_table": [4],
                "maxnum_catfeature_query_per_table_per_sample": [8],
                "default_value_for_each_table": [0.5],
                "max_batch_size": 16,
                "gpucache": True,
                "gpucacheper": 1.0,
            }
        ],
        "volatile_db": {
            "type": "redis",
            "address": redis.address,
            "password": SECRETS["redis password"],
            "num_partitions": 2,
        },
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
        "update_source": {
            "type": "kafka_message_queue",
            "brokers": kafka.bootstrap,
            "poll_timeout_ms": 200,
            "hps_group_id": f"g-sec-{suffix}",
            "hps_dead_letter_topic": f"dead.sec.{suffix}",
            "hps_kafka_config": {
                **FAST_GROUP,
                "ssl.keystore.password": SECRETS["ssl.keystore.password"],
                "sasl.oauthbearer.config": SECRETS["sasl.oauthbearer.config"],
                "sasl.password": SECRETS["sasl.password"],
            },
        },
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, kafka_broker: TansuBroker) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("secrets")
    redis = RedisNode(
        root / "redis",
        extra_args=["--requirepass", SECRETS["redis password"]],
        password=SECRETS["redis password"],
    )
    redis.start()
    procs: list[Proc] = []
    try:
        write_tables(root / "tables", TABLES, seed_base=5)
        ps_json = root / "ps.json"
        ps_json.write_text(json.dumps(_ps_json(root, redis, kafka_broker), indent=1))
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "HPS_ADMIN_KEY": SECRETS["admin key"],
            "HPS_ADMIN_TOKEN": SECRETS["control-plane token"],
        }
        env.pop("HPS_ADMIN_KEY_FILE", None)
        env.pop("HPS_ADMIN_TOKEN_FILE", None)
        http, grpc, metrics = free_port(), free_port(), free_port()
        serve = _start(
            "serve",
            ["-v", "serve", "--config", str(ps_json), "--state-dir", str(root / "state"),
             "--http-port", str(http), "--grpc-port", str(grpc),
             "--metrics-port", str(metrics)],
            root, env,
        )  # fmt: skip
        procs.append(serve)
        banner = f"--model {MODEL} --keys"
        _wait(serve, lambda: banner in serve.log.read_text(errors="replace"), "banner")
        consume_port, admin_port = free_port(), free_port()
        procs.append(
            _start(
                "consume",
                ["consume", "--config", str(ps_json), "--metrics-port", str(consume_port)],
                root,
                env,
            )  # fmt: skip
        )
        triton_metrics = f"http://127.0.0.1:{metrics}/metrics"
        admin_env = {**env, "HPS_TRITON_METRICS_URL": triton_metrics}
        procs.append(
            _start(
                "admin",
                [
                    "admin",
                    "--config",
                    str(ps_json),
                    "--port",
                    str(admin_port),
                    "--triton-url",
                    f"127.0.0.1:{http}",
                ],
                root,
                admin_env,
            )  # fmt: skip
        )
        admin_url = f"http://127.0.0.1:{admin_port}"
        consume_url = f"http://127.0.0.1:{consume_port}/metrics"
        _wait(procs[1], lambda: _answers(consume_url), "metrics port", 60)
        _wait(procs[2], lambda: _answers(admin_url + "/healthz"), "/healthz", 60)
        yield Stack(
            root, ps_json, f"127.0.0.1:{http}", triton_metrics, admin_url, consume_url, procs
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)
        redis.stop()


def _call(
    url: str,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, str]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_no_secret_in_logs_bodies_metrics_config_or_plan(stack: Stack) -> None:
    key, token = SECRETS["admin key"], SECRETS["control-plane token"]
    seen: dict[str, str] = {}  # what -> text a client or an operator gets to see

    # Triton, through the request-size gate: the admin APIs without, with a wrong and with
    # the right key; bad inference requests; the metrics.
    index = f"http://{stack.http}/v2/repository/index"
    for name, headers in [
        ("no key", {}),
        ("wrong key", {"hps-admin-key": key[:-1]}),
        ("key + 1", {"hps-admin-key": key + "x"}),
    ]:
        status, seen[f"triton index, {name}"] = _call(index, "POST", {}, headers)
        assert status == 403, seen[f"triton index, {name}"]
    status, seen["triton index, right key"] = _call(index, "POST", {}, {"hps-admin-key": key})
    assert status == 200 and MODEL in seen["triton index, right key"]
    infer = f"http://{stack.http}/v2/models/{MODEL}/infer"
    status, seen["triton infer, not json"] = _call(infer, "POST", raw=b"{nope")
    assert status >= 400  # Triton 2.51 answers 500 to malformed JSON
    too_many = {
        "inputs": [
            {"name": "KEYS", "datatype": "INT64", "shape": [1, 500], "data": list(range(500))},
            {"name": "NUMKEYS", "datatype": "INT32", "shape": [1, 1], "data": [500]},
        ]
    }
    status, seen["triton infer, too many keys"] = _call(infer, "POST", too_many)
    assert status == 400 and "exceed" in seen["triton infer, too many keys"]
    query = subprocess.run(
        [*HPS, "query", "--url", stack.http, "--model", MODEL, "--keys", "1,2,3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    seen["hps query"] = query.stdout + query.stderr
    seen["triton /metrics"] = urllib.request.urlopen(stack.triton_metrics).read().decode()

    # The control plane: config and reports (no token needed), refusals, bad requests, a
    # secret in a query string (the access log prints paths), the metrics.
    admin = stack.admin
    for path in ["/v1/config", "/v1/models", f"/v1/models/{MODEL}/tables/t", "/readyz"]:
        status, seen[f"admin {path}"] = _call(admin + path)
        assert status in (200, 503), seen[f"admin {path}"]
    config = json.loads(seen["admin /v1/config"])
    assert config["volatile_db"]["password"] == REDACTED
    kafka = config["update_source"]["hps_kafka_config"]
    for name in ("ssl.keystore.password", "sasl.oauthbearer.config", "sasl.password"):
        assert kafka[name] == REDACTED
    assert json.loads(seen["admin /readyz"])["ready"], seen["admin /readyz"]
    delete = f"{admin}/v1/models/{MODEL}/tables/t/keys"
    for name, headers in [
        ("no token", {}),
        ("wrong token", _bearer("wrong")),
        ("token + 1", _bearer(token + "x")),
        ("the admin key as token", _bearer(key)),
    ]:
        status, seen[f"admin delete, {name}"] = _call(delete, "DELETE", {"keys": [1]}, headers)
        assert status == 401, seen[f"admin delete, {name}"]
    lookup = f"{admin}/v1/models/{MODEL}/tables/t/lookup"
    status, seen["admin lookup"] = _call(lookup, "POST", {"keys": [1, 2]}, _bearer(token))
    assert status == 200, seen["admin lookup"]
    status, seen["admin lookup, bad body"] = _call(lookup, "POST", {"keys": "x"}, _bearer(token))
    assert status == 422
    status, seen["admin unknown table"] = _call(
        f"{admin}/v1/models/{MODEL}/tables/nope/lookup", "POST", {"keys": [1]}, _bearer(token)
    )
    assert status == 404
    status, seen["admin unknown job"] = _call(f"{admin}/v1/jobs/nope")
    assert status == 404
    status, seen["admin token in query"] = _call(f"{admin}/v1/config?token={token}&key={key}")
    assert status == 200
    seen["admin /metrics"] = urllib.request.urlopen(admin + "/metrics").read().decode()
    seen["consume /metrics"] = urllib.request.urlopen(stack.consume_metrics).read().decode()

    # hps plan, text and JSON
    for flags in ([], ["--json"]):
        plan = subprocess.run(
            [*HPS, "plan", "--config", str(stack.ps_json), *flags],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert plan.returncode == 0, plan.stderr
        seen[f"hps plan {flags}"] = plan.stdout + plan.stderr

    # Every process's whole output, once stopped (their last lines included).
    for proc in reversed(stack.procs):
        _stop(proc)
        seen[f"{proc.name} log"] = proc.log.read_text(errors="replace")
    assert not (stack.root / "state" / "hps-admin-key").exists()  # the key came from the env

    # The logs did carry what was scrubbed: the command line with the key, the access log
    # line with the secrets in its query string.
    if "tritonserver --model-repository" in seen["serve log"]:  # logged when verbose
        assert f"hps-admin-key={REDACTED}" in seen["serve log"]
    assert f"/v1/config?token={REDACTED}&key={REDACTED}" in seen["admin log"]
    hits = [
        f"{secret_name} in {what}"
        for what, text in seen.items()
        for secret_name, value in SECRETS.items()
        if value in text
    ]
    assert not hits, hits


@pytest.mark.parametrize("command", ["serve", "consume", "admin"])
def test_a_bad_kafka_setting_stops_each_process_at_start(tmp_path: Path, command: str) -> None:
    """A misspelled librdkafka setting is a config error at start (exit 2, the setting
    named, no secret shown), before any port, import or broker is touched."""
    write_tables(tmp_path / "tables", TABLES, seed_base=5)
    secret = SECRETS["ssl.keystore.password"]
    doc: dict[str, Any] = {
        "models": [
            {
                "model": MODEL,
                "sparse_files": [str(tmp_path / "tables" / MODEL / "t")],
                "embedding_table_names": ["t"],
                "embedding_vecsize_per_table": [4],
            }
        ],
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
        "update_source": {
            "type": "kafka",
            "brokers": f"127.0.0.1:{free_port()}",  # nothing listens: never contacted
            "hps_kafka_config": {"ssl.keystore.password": secret, "sasl.oauthbearr.config": secret},
        },
    }
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    ports = {
        "serve": ["--http-port", str(free_port()), "--grpc-port", str(free_port()),
                  "--metrics-port", str(free_port())],
        "consume": [],
        "admin": ["--port", str(free_port())],
    }[command]  # fmt: skip
    done = subprocess.run(
        [*HPS, command, "--config", "ps.json", *ports],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"hps {command}: error: ps.json: update_source.hps_kafka_config: "
        'No such configuration property: "sasl.oauthbearr.config"'
    ) in done.stderr
    assert secret not in done.stdout + done.stderr
    assert not (tmp_path / "rocksdb").exists()  # nothing imported

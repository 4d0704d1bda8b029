"""Locust users for HPS: Triton gRPC / HTTP readers, the CTR model, bad requests, the
publisher (bulk updates and freshness probes) and the control plane's read routes.

Run it through ``hps loadtest`` (which starts the stack and picks the users), or directly:
``locust -f loadtests/locustfile.py --headless --hps-config ps.json --triton-grpc H:P ...``
(``locust -f loadtests/locustfile.py --help`` lists the HPS options). Request types, as
Locust's statistics and the thresholds name them: ``grpc lookup``, ``http lookup``,
``grpc ctr``, ``grpc bad request``, ``kafka publish``, ``kafka freshness`` and
``GET <route>`` (the control plane). A wrong vector or score is a failure
(``WrongAnswer``); a bad request that Triton does not refuse with a client error is one too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import grpc.experimental.gevent as grpc_gevent
import numpy as np
from locust import FastHttpUser, LoadTestShape, User, constant, constant_pacing, events, task
from locust.env import Environment

from hps.loadtest import options as opts
from hps.loadtest.steps import StageRecorder, stage_at, stages, updates_on
from hps.loadtest.thresholds import evaluate, load_thresholds
from hps.loadtest.workload import Workload, WrongAnswer, load_workload

grpc_gevent.init_gevent()  # before any gRPC use, or each call blocks every user
log = logging.getLogger("hps.loadtest")

READ_TYPES = {"grpc lookup", "http lookup", "grpc ctr"}
STATE: dict[str, Any] = {}


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    opts.add_locust_options(parser)


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    o = environment.parsed_options
    if o is None or not o.hps_config:
        return
    from hps.config import load_config

    config = load_config(o.hps_config)
    STATE["workload"] = load_workload(
        config,
        o.hps_model or None,
        zipf=o.zipf,
        samples=opts.sample_range(o.samples),
        keys_per_sample=o.keys_per_sample,
        verify_per_table=o.verify_keys,
        seed=o.hps_seed,
    )
    # Without limits of its own a run fails on any failure, as Locust alone would.
    STATE["thresholds"] = load_thresholds(o.thresholds, o.threshold or []) or {
        "*": {"max_fail_ratio": 0.0}
    }
    for cls, weight in opts.weights(o.mix).items():
        USERS[cls].weight = weight
    Updater.wait_time = constant_pacing(o.update_batch_rows / max(o.update_rows_per_s, 1e-9))
    Prober.wait_time = constant_pacing(o.freshness_interval)
    AdminReader.host = o.admin_url  # FastHttpUser needs it when the user is created
    run_time = float(o.run_time or 60)
    plan = stages(o.hps_shape, o.num_users or 1, run_time, o.ramp_steps, o.update_phases)
    STATE["recorder"] = StageRecorder(plan, READ_TYPES)
    STATE["started"] = None

    def on_request(request_type: str, name: str, response_time: float, **kw: Any) -> None:
        started = STATE["started"]
        if started is not None:
            t = time.monotonic() - started
            STATE["recorder"].record(
                t, f"{request_type} {name}", response_time, bool(kw.get("exception"))
            )

    environment.events.request.add_listener(on_request)


@events.quitting.add_listener
def _quitting(environment: Environment, **_: Any) -> None:
    """Enforce the thresholds: the process's exit code is 1 when one is broken, else 0."""
    o = environment.parsed_options
    if o is None or "thresholds" not in STATE:
        return
    stats = environment.stats
    entries: list[Any] = list(stats.entries.values())  # StatsEntry: a thresholds.Entry
    violations = evaluate(STATE["thresholds"], entries, cast(Any, stats.total))
    report = Path(o.hps_report_dir) if o.hps_report_dir else None
    rows = []
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        rows = STATE["recorder"].write(report / "stages.csv")
        updates = STATE["recorder"].compare_updates(o.update_phases)
        (report / "verdict.json").write_text(
            json.dumps(
                {
                    "passed": not violations,
                    "violations": [str(v) for v in violations],
                    "thresholds": STATE["thresholds"],
                    "stages": rows,
                    "reads_and_updates": updates,
                },
                indent=1,
            )
            + "\n"
        )
    for v in violations:
        log.error("threshold broken: %s", v)
    environment.process_exit_code = 1 if violations else 0


class HPSShape(LoadTestShape):
    """``--hps-shape``: steady, ramp or spike over ``-u`` readers and ``-t`` seconds."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        runner = self.runner
        o = runner.environment.parsed_options if runner else None
        if runner is None or o is None or "recorder" not in STATE:
            return None
        if STATE["started"] is None:
            STATE["started"] = time.monotonic()
        plan = STATE["recorder"].plan
        index = stage_at(plan, self.get_run_time())
        if index is None:
            return None
        fixed = sum(int(c.fixed_count) for c in runner.user_classes)
        return plan[index][1] + fixed, float(o.spawn_rate or 10)


def _fire(env: Environment, rtype: str, name: str, call: Callable[[], int]) -> None:
    """Time ``call`` (it returns the response length) and report it to Locust."""
    start = time.perf_counter()
    exc: BaseException | None = None
    length = 0
    try:
        length = call()
    except Exception as e:  # every failure is reported to Locust, none ends the user
        exc = e
    env.events.request.fire(
        request_type=rtype, name=name, response_time=(time.perf_counter() - start) * 1e3,
        response_length=length, exception=exc, context={},
    )  # fmt: skip


class TritonUser(User):
    """A reader with its own tritonclient connection (closed in on_stop)."""

    abstract = True
    wait_time = constant(0)
    protocol = "grpc"

    def on_start(self) -> None:
        from hps.triton.client import Client

        o = self.environment.parsed_options
        url = o.triton_grpc if self.protocol == "grpc" else o.triton_http
        self.client = Client(url, grpc=self.protocol == "grpc")
        self.work: Workload = STATE["workload"]
        self.rng = np.random.default_rng()

    def on_stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()  # else Locust hangs at exit in the gRPC channel's __del__

    def lookup(self) -> int:
        req = self.work.lookup_request(self.rng)
        out = self.client.infer(self.work.name, req.inputs)
        req.check(out)
        return int(out.nbytes)


class GrpcReader(TritonUser):
    @task
    def read(self) -> None:
        _fire(self.environment, "grpc", "lookup", self.lookup)


class HttpReader(TritonUser):
    protocol = "http"

    @task
    def read(self) -> None:
        _fire(self.environment, "http", "lookup", self.lookup)


class CtrReader(TritonUser):
    """The example CTR model ``<model>_ctr`` (lookup, pooling and the dense network)."""

    @task
    def predict(self) -> None:
        def call() -> int:
            req = self.work.ctr_request(self.rng)
            out = self.client.infer(f"{self.work.name}_ctr", req.inputs)
            req.check(out)
            return int(out.nbytes)

        _fire(self.environment, "grpc", "ctr", call)


class BadRequester(TritonUser):
    """A few malformed requests: each must be refused with a client error, nothing else."""

    wait_time = constant(0.5)

    @task
    def bad(self) -> None:
        from hps.errors import RequestError, UnknownTableError

        bad = self.work.bad_requests()
        what, inputs = bad[int(self.rng.integers(0, len(bad)))]

        def call() -> int:
            try:
                self.client.infer(self.work.name, inputs)
            except UnknownTableError as exc:
                raise WrongAnswer(f"{what}: refused as unknown model: {exc}") from None
            except RequestError:
                return 0  # refused as it should be
            raise WrongAnswer(f"{what}: Triton accepted a malformed request")

        _fire(self.environment, "grpc", "bad request", call)


class KafkaUser(User):
    """Publishes through ``hps.updates.Publisher`` to the ps.json's update topics."""

    abstract = True
    fixed_count = 1

    def on_start(self) -> None:
        from hps.updates.producer import Publisher

        self.work = STATE["workload"]
        self.publisher = Publisher(self.environment.parsed_options.brokers)
        self.rng = np.random.default_rng()

    def on_stop(self) -> None:
        self.publisher.close(timeout_s=10.0)


class Updater(KafkaUser):
    """Bulk updates of BULK-class keys at ``--update-rows-per-s`` (never verified keys)."""

    @task
    def publish(self) -> None:
        o = self.environment.parsed_options
        started = STATE["started"]
        t = time.monotonic() - started if started is not None else 0.0
        if not updates_on(o.update_phases, stage_at(STATE["recorder"].plan, t)):
            return  # a phase without bulk updates
        t = self.work.tables[int(self.rng.integers(0, len(self.work.tables)))]
        if t.bulk_keys.size == 0:
            return
        keys = t.bulk_keys[self.rng.integers(0, t.bulk_keys.size, o.update_batch_rows)]
        vectors = self.rng.standard_normal((keys.size, t.spec.dim), dtype=np.float32)

        def call() -> int:
            self.publisher.publish(self.work.name, t.spec.table, keys, vectors)
            return int(vectors.nbytes)

        _fire(self.environment, "kafka", "publish", call)


class Prober(KafkaUser):
    """Freshness: publish new vectors for FRESH-class keys, time until Triton serves them."""

    def on_start(self) -> None:
        super().on_start()
        from hps.triton.client import Client

        self.client = Client(self.environment.parsed_options.triton_grpc, grpc=True)

    def on_stop(self) -> None:
        self.client.close()
        super().on_stop()

    @task
    def probe(self) -> None:
        o = self.environment.parsed_options
        ti = int(self.rng.integers(0, len(self.work.tables)))
        t = self.work.tables[ti]
        if t.fresh_keys.size == 0:
            return
        n = min(o.freshness_keys, t.fresh_keys.size)
        keys = self.rng.choice(t.fresh_keys, n, replace=False)
        vectors = self.rng.standard_normal((n, t.spec.dim), dtype=np.float32)
        probe_keys, numkeys = self.work.probe_request(ti, keys)
        inputs = {"KEYS": probe_keys[None], "NUMKEYS": numkeys[None]}

        def call() -> int:
            self.publisher.publish(self.work.name, t.spec.table, keys, vectors)
            deadline = time.perf_counter() + o.freshness_timeout
            while True:
                got = self.client.infer(self.work.name, inputs).reshape(n, t.spec.dim)
                if np.allclose(got, vectors, rtol=1e-5, atol=1e-6):
                    return int(vectors.nbytes)
                if time.perf_counter() > deadline:
                    raise WrongAnswer(f"update not served after {o.freshness_timeout}s")
                time.sleep(0.005)  # gevent-patched: the other users run meanwhile

        _fire(self.environment, "kafka", "freshness", call)


class AdminReader(FastHttpUser):
    """The control plane's read routes (``hps admin``), when ``--admin-url`` is given."""

    fixed_count = 1
    wait_time = constant(0.2)

    def on_start(self) -> None:
        self.work = STATE["workload"]
        self.rng = np.random.default_rng()

    def _get(self, path: str, name: str, check: Callable[[Any], None]) -> None:
        with self.rest("GET", path, name=name) as resp:  # request type: "GET <route>"
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {(resp.text or '')[:200]}")
            elif resp.js is None:
                resp.failure("not JSON")
            else:
                try:
                    check(resp.js)
                except (AssertionError, KeyError, TypeError) as exc:
                    resp.failure(f"unexpected body: {exc}")

    @task
    def readyz(self) -> None:
        self._get("/readyz", "/readyz", lambda body: None)

    @task
    def models(self) -> None:
        self._get("/v1/models", "/v1/models", lambda body: _assert_in(self.work.name, body))

    @task(2)
    def table(self) -> None:
        t = self.work.tables[int(self.rng.integers(0, len(self.work.tables)))]
        path = f"/v1/models/{self.work.name}/tables/{t.spec.table}"

        def check(body: Any) -> None:
            if isinstance(body, dict) and "dim" in body:
                assert body["dim"] == t.spec.dim, f"dim {body['dim']} != {t.spec.dim}"

        self._get(path, "/v1/models/{model}/tables/{table}", check)


def _assert_in(name: str, body: Any) -> None:
    assert name in json.dumps(body), f"model {name!r} not listed"


USERS: dict[str, type[User]] = {
    "grpc": GrpcReader,
    "http": HttpReader,
    "ctr": CtrReader,
    "bad": BadRequester,
    "updates": Updater,
    "freshness": Prober,
    "admin": AdminReader,
}

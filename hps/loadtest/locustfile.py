"""Locust users for HPS: Triton gRPC / HTTP readers, the CTR model, bad requests, the
publisher (bulk updates and freshness probes) and the control plane's read routes.

Run it through ``hps loadtest`` (which starts the stack and picks the users), or directly:
``locust -f loadtests/locustfile.py --headless --hps-config ps.json --triton-grpc H:P ...``
(``locust -f loadtests/locustfile.py --help`` lists the HPS options). Request types, as
Locust's statistics and the thresholds name them: ``grpc lookup``, ``http lookup``,
``grpc ctr``, ``grpc bad request``, ``kafka publish``, ``kafka freshness`` and
``GET <route>`` (the control plane). A wrong vector or score is a failure
(``WrongAnswer``); a bad request that Triton does not refuse as malformed is one too.

The users live in :mod:`hps.loadtest.users`; this module sets them up from the options,
shapes the load and, when Locust quits, writes the final statistics (``stats.json``) and
judges the run (:mod:`hps.loadtest.verdict`: the thresholds, and any exception raised in a
user). Locust collects the user classes from its namespace.
"""

from __future__ import annotations

import argparse
import logging
import time
import traceback
from pathlib import Path
from types import TracebackType

import grpc.experimental.gevent as grpc_gevent
import locust.log
from locust import LoadTestShape, User, constant_pacing, events
from locust.env import Environment

from hps.loadtest import options as opts
from hps.loadtest import stats as final_stats
from hps.loadtest.steps import StageRecorder, stage_at, stages
from hps.loadtest.thresholds import load_thresholds
from hps.loadtest.users.admin import AdminReader
from hps.loadtest.users.kafka import Prober, Updater
from hps.loadtest.users.shared import READ_TYPES, STATE
from hps.loadtest.users.triton import BadRequester, CtrReader, GrpcReader, HttpReader
from hps.loadtest.verdict import crashes, judge
from hps.loadtest.workload import load_workload

grpc_gevent.init_gevent()  # before any gRPC use, or each call blocks every user
log = logging.getLogger("hps.loadtest")


@events.init_command_line_parser.add_listener
def _add_options(parser: argparse.ArgumentParser) -> None:
    opts.add_locust_options(parser)


@events.init.add_listener
def _init(environment: Environment, **_: object) -> None:
    o = environment.parsed_options
    if o is None or not o.hps_config:
        return
    from hps.config import load_config

    config = load_config(o.hps_config)
    STATE.workload = load_workload(
        config,
        o.hps_model or None,
        zipf=o.zipf,
        samples=opts.sample_range(o.samples),
        keys_per_sample=o.keys_per_sample,
        verify_per_table=o.verify_keys,
        seed=o.hps_seed,
    )
    # Without limits of its own a run fails on any failure, as Locust alone would.
    STATE.thresholds = load_thresholds(o.thresholds, o.threshold or []) or {
        "*": {"max_fail_ratio": 0.0}
    }
    for cls, weight in opts.weights(o.mix).items():
        USERS[cls].weight = weight
    Updater.wait_time = constant_pacing(o.update_batch_rows / max(o.update_rows_per_s, 1e-9))
    Prober.wait_time = constant_pacing(o.freshness_interval)
    AdminReader.host = o.admin_url  # FastHttpUser needs it when the user is created
    run_time = float(o.run_time or 60)
    plan = stages(o.hps_shape, o.num_users or 1, run_time, o.ramp_steps, o.update_phases)
    STATE.recorder = recorder = StageRecorder(plan, READ_TYPES)
    STATE.started = None

    def on_request(request_type: str, name: str, response_time: float, **kw: object) -> None:
        if STATE.started is not None:
            recorder.record(
                STATE.elapsed(), f"{request_type} {name}", response_time, bool(kw.get("exception"))
            )

    environment.events.request.add_listener(on_request)


@events.user_error.add_listener
def _user_error(user_instance: User, exception: Exception, tb: TracebackType, **_: object) -> None:
    """Name the type of each exception that Locust keeps (by traceback) in runner.exceptions."""
    STATE.exception_types["".join(traceback.format_tb(tb))] = type(exception).__name__


@events.quitting.add_listener
def _quitting(environment: Environment, **_: object) -> None:
    """Judge the run and set the process's exit code by it (:mod:`hps.loadtest.verdict`:
    1 for a broken threshold or an exception in a user, 2 after an unhandled greenlet
    exception, else 0); write ``stats.json``, ``stages.csv`` and ``verdict.json``."""
    o = environment.parsed_options
    if o is None or STATE.thresholds is None or STATE.recorder is None:
        return
    stats = environment.stats
    raised = environment.runner.exceptions if environment.runner else {}
    crashed = crashes(raised, STATE.exception_types, locust.log.unhandled_greenlet_exception)
    verdict = judge(STATE.thresholds, stats.entries.values(), stats.total, crashed)
    if o.hps_report_dir:
        report = Path(o.hps_report_dir)
        report.mkdir(parents=True, exist_ok=True)
        doc = final_stats.snapshot(stats.entries.values(), stats.total, stats.errors.values())
        final_stats.write(report, doc)
        verdict.write(
            report / "verdict.json",
            thresholds=STATE.thresholds,
            stages=STATE.recorder.write(report / "stages.csv"),
            reads_and_updates=STATE.recorder.compare_updates(o.update_phases),
        )
    for v in verdict.violations:
        log.error("threshold broken: %s", v)
    for c in verdict.crashes:
        log.error("exception in users: %s", c)
    environment.process_exit_code = verdict.exit_code


class HPSShape(LoadTestShape):
    """``--hps-shape``: steady, ramp or spike over ``-u`` readers and ``-t`` seconds."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        runner = self.runner
        o = runner.environment.parsed_options if runner else None
        if runner is None or o is None or STATE.recorder is None:
            return None
        if STATE.started is None:
            STATE.started = time.monotonic()
        plan = STATE.recorder.plan
        index = stage_at(plan, self.get_run_time())
        if index is None:
            return None
        fixed = sum(int(c.fixed_count) for c in runner.user_classes)
        return plan[index][1] + fixed, float(o.spawn_rate or 10)


USERS: dict[str, type[User]] = {
    "grpc": GrpcReader,
    "http": HttpReader,
    "ctr": CtrReader,
    "bad": BadRequester,
    "updates": Updater,
    "freshness": Prober,
    "admin": AdminReader,
}

"""Users that publish to the ps.json's update topics: bulk updates and freshness probes.

Their publisher's blocking calls (metadata, a full local queue, delivery) run off the gevent
loop (:class:`hps.loadtest.users.publisher.OffLoopPublisher`), so they never stall the
readers. ``kafka publish`` is one bulk batch from ``publish()`` to the broker's
acknowledgement of all of it; a delivery error, or no acknowledgement within
:data:`~hps.loadtest.users.publisher.ACK_TIMEOUT_S`, is its failure. A probe whose update the
broker refuses fails with the delivery error.

Bulk updates touch only BULK-class keys and the probes only FRESH-class keys
(:func:`hps.loadtest.keys.key_class`), so the readers' verified keys never change.

A probe publishes new vectors, then starts a lookup of them every :data:`POLL_S` without
waiting for the previous one to return, and times ``publish()`` to the first lookup that
returns the new vectors. Lookups in flight together keep the probe's own sampling out of
the figure: it is when Triton first serves the update, plus one lookup, to within
:data:`POLL_S` (a probe that waited for each lookup before sending the next would add up to
a whole lookup more, a hundred milliseconds and more under load).

Probes started in the first ``--freshness-warmup`` seconds are reported apart, as ``kafka
freshness (warm-up)`` and ``kafka visible (warm-up)``: a stack's first seconds (its update
consumer joining its group, the readers arriving) are not the steady state the figures
describe.

Each probe reports a second figure, ``kafka visible``: ``publish()`` to the moment Triton
began serving the update, the instant the serving processes' ``hps_update_freshness_seconds``
times. The probe's lookups ask ``hps_embedding`` for ``LOOKUP_START_NS`` (when the instance
began each lookup); the update became visible between the start of the last lookup that
missed it and the start of the first that returned it, and the figure is the middle of that
interval (:func:`hps.loadtest.freshness.visible_after`; its width is about :data:`POLL_S`).
"""

from __future__ import annotations

import time

import numpy as np
from gevent.event import Event
from gevent.pool import Group
from locust import User, task

from hps.loadtest.freshness import WARMUP, visible_after
from hps.loadtest.keys import served
from hps.loadtest.requests import WrongAnswer
from hps.loadtest.steps import stage_at, updates_on
from hps.loadtest.users.publisher import OffLoopPublisher
from hps.loadtest.users.shared import STATE, fire, report

POLL_S = 0.02  # a probe starts a lookup this often until one returns the new vectors
START = "LOOKUP_START_NS"


class KafkaUser(User):
    """Publishes through ``hps.updates.Publisher`` to the ps.json's update topics."""

    abstract = True
    fixed_count = 1

    def on_start(self) -> None:
        from hps.updates.producer import Publisher

        o = self.environment.parsed_options
        assert o is not None
        self.work = STATE.work()
        self.rng = np.random.default_rng()
        self.publisher = OffLoopPublisher(Publisher(o.brokers))
        # topics and their metadata now: else each table's first publish waits for them
        self.publisher.prepare(self.work.name, [t.spec.table for t in self.work.tables])

    def on_stop(self) -> None:
        publisher = getattr(self, "publisher", None)
        if publisher is not None:
            publisher.close()


class Updater(KafkaUser):
    """Bulk updates of BULK-class keys at ``--update-rows-per-s`` (never verified keys)."""

    @task
    def publish(self) -> None:
        o = self.environment.parsed_options
        assert o is not None and STATE.recorder is not None
        if not updates_on(o.update_phases, stage_at(STATE.recorder.plan, STATE.elapsed())):
            return  # a phase without bulk updates
        t = self.work.tables[int(self.rng.integers(0, len(self.work.tables)))]
        if t.bulk_keys.size == 0:
            return
        keys = t.bulk_keys[self.rng.integers(0, t.bulk_keys.size, o.update_batch_rows)]
        vectors = self.rng.standard_normal((keys.size, t.spec.dim), dtype=np.float32)

        def call() -> int:
            self.publisher.publish_acked(self.work.name, t.spec.table, keys, vectors)
            return int(vectors.nbytes)

        fire(self.environment, "kafka", "publish", call)


class Prober(KafkaUser):
    """Freshness: publish new vectors for FRESH-class keys, time until Triton serves them."""

    def on_start(self) -> None:
        super().on_start()
        from hps.triton.client import Client

        o = self.environment.parsed_options
        assert o is not None
        self.client = Client(o.triton_grpc, grpc=True)

    def on_stop(self) -> None:
        self.client.close()
        super().on_stop()

    @task
    def probe(self) -> None:
        o = self.environment.parsed_options
        assert o is not None
        ti = int(self.rng.integers(0, len(self.work.tables)))
        t = self.work.tables[ti]
        if t.fresh_keys.size == 0:
            return
        n = min(o.freshness_keys, t.fresh_keys.size)
        keys = self.rng.choice(t.fresh_keys, n, replace=False)
        vectors = self.rng.standard_normal((n, t.spec.dim), dtype=np.float32)
        want = served(t.spec, vectors)  # as the table's row format stores them
        probe_keys, numkeys = self.work.probe_request(ti, keys)
        inputs = {"KEYS": probe_keys[None], "NUMKEYS": numkeys[None]}
        served_at: list[float] = []
        started: list[tuple[int, bool]] = []  # (when Triton began the lookup, returned it)
        errors: list[Exception] = []
        seen = Event()

        def lookup() -> None:
            try:
                out = self.client.infer_outputs(self.work.name, inputs, ("OUTPUT0", START))
            except Exception as exc:  # reported as the probe's failure
                errors.append(exc)
                seen.set()
                return
            fresh = np.allclose(out["OUTPUT0"].reshape(n, t.spec.dim), want, 1e-5, 1e-6)
            started.append((int(out[START].flat[0]), fresh))
            if fresh:
                served_at.append(time.perf_counter())
                seen.set()

        def delivered() -> None:
            try:
                self.publisher.deliver(o.freshness_timeout)
            except Exception as exc:  # the broker refused the update: the probe fails
                errors.append(exc)
                seen.set()

        lookups = Group()
        phase = WARMUP if STATE.elapsed() < o.freshness_warmup else ""
        start = time.perf_counter()
        publish_ns = time.time_ns()
        failure: Exception | None = None
        try:
            self.publisher.publish(self.work.name, t.spec.table, keys, vectors)
        except Exception as exc:
            failure = exc
        else:
            lookups.spawn(delivered)
        deadline = start + o.freshness_timeout
        while failure is None and not seen.is_set():
            if time.perf_counter() > deadline:
                failure = WrongAnswer(f"update not served after {o.freshness_timeout}s")
                break
            lookups.spawn(lookup)
            seen.wait(POLL_S)
        lookups.join()  # lookups in flight finish (a killed gRPC call would leave its stream)
        if failure is None and not served_at:
            failure = errors[0]
        seconds = min(served_at) - start if served_at else time.perf_counter() - start
        size = int(vectors.nbytes)
        report(self.environment, "kafka", "freshness" + phase, seconds, size, failure)
        visible = visible_after(publish_ns, started)
        if failure is None and visible is not None:
            report(self.environment, "kafka", "visible" + phase, visible, size)

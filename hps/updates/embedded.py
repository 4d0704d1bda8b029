"""Embedded mode: a serving process applies updates to its own in-process L2 (and L3 when it
opened it read-write) and refreshes its L1 in the same pass (:func:`start_background_applier`).

It reads every partition of its tables' topics with no consumer group and no commits: from
the beginning (its L2 starts empty, so it must see every retained update), or, for a model
version imported later, from the first message stamped at or after that version's import
start (:func:`hps.updates.routing.start_ms`). It applies what goes to its own version only
(:class:`hps.updates.routing.Router` with ``own``). A client that hits a fatal error
(:class:`hps.errors.ClientLost`) is replaced by a new one, which reads every partition
again from there (the per-key update versions make that change nothing).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hps.config import PSConfig
from hps.errors import ClientLost
from hps.updates.applier import Applied
from hps.updates.consumer import UpdateConsumer
from hps.updates.freshness import L1Refresher
from hps.updates.metrics import PrometheusRecorder, Recorder
from hps.updates.runtime import (
    UpdateThread,
    build_applier,
    check_enabled,
    timed_pass2,
    topics_of,
    version_router,
)
from hps.updates.source import MessageSource

if TYPE_CHECKING:
    from hps.lookup import LookupSession

log = logging.getLogger(__name__)


def start_background_applier(
    session: LookupSession, config: PSConfig, recorder: Recorder | None = None
) -> UpdateThread:
    """Embedded mode: apply every update to this process's L2 (and L3 if writable) and L1."""
    check_enabled(config)
    us = config.update_source
    refresher = L1Refresher(session)
    recorder = recorder or PrometheusRecorder()

    def refresh(batch: Sequence[Applied]) -> None:
        start = time.perf_counter()
        for applied in batch:
            refresher.now(applied.table, applied.keys, applied.values)
            refresher.now(applied.table, applied.deleted, None)
            refresher.later(applied.table, applied.keys)
            refresher.later(applied.table, applied.deleted)
        recorder.stage("l1_refresh", time.perf_counter() - start)

    applier = build_applier(
        config, session, shared_only=False, listeners=[refresh], recorder=recorder
    )
    router = version_router(config, applier.tables, own=True)

    def new_source() -> MessageSource:
        return MessageSource(
            us.brokers,
            topics_of(applier.tables),
            mode="replay",
            group_id=f"{us.hps_group_id}-embedded-{uuid.uuid4().hex[:8]}",
            config=us.kafka_settings,
            start_ms=router.own_starts(),
        )

    consumer = UpdateConsumer(
        new_source(), applier, us, recorder=recorder, serving=True, router=router
    )
    lost = False  # the client hit a fatal error: a new one is made at the next step

    def step(stop: threading.Event) -> None:
        nonlocal lost
        if lost:  # made here, not where it was lost: a broker away fails this, retried
            consumer.source = new_source()
            lost = False
        try:
            consumer.run_once(stop)  # a failed batch is read again (UpdateConsumer.run_once)
        except ClientLost:  # for good: a new client reads again from the start (idempotent)
            with contextlib.suppress(Exception):  # whatever a broken client says on closing
                consumer.source.close()
            lost = True
            raise
        timed_pass2(recorder, refresher)

    return UpdateThread(
        "hps-embedded-applier", step, refresher, close=lambda: consumer.source.close()
    )

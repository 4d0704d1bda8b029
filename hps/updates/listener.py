"""Shared mode: a serving process keeps its L1 fresh from the update topics while
``hps consume`` applies them to L2/L3 (:func:`start_l1_listener`; docs/updates.md,
"Freshness").

It reads every partition from the service group's committed offset (what ``hps consume``
has not applied yet: a row L1 loads from L2/L3 meanwhile would stay stale once it does; the
beginning where the group committed nothing), with no commits of its own; with the group's
id it reads how far the group has committed (pass 2 of the refresh, and when a message
counts as served). A serving instance of model version v refreshes for the messages that
go to v only (:class:`hps.updates.routing.Router` with ``own``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hps.config import PSConfig
from hps.errors import ClientLost, FormatError, HPSError, RequestError
from hps.rowformat import Stored
from hps.tiers import encode_rows
from hps.types import Keys
from hps.updates.freshness import L1Refresher, Offset, Ready, Served
from hps.updates.messages import batches_for, read_message
from hps.updates.metrics import PrometheusRecorder, Recorder
from hps.updates.routing import Router
from hps.updates.runtime import (
    UpdateThread,
    check_enabled,
    consumed_models,
    timed_pass2,
    topics_of,
    version_router,
)
from hps.updates.source import MessageSource

if TYPE_CHECKING:
    from confluent_kafka import Message

    from hps.lookup import LookupSession

log = logging.getLogger(__name__)

LISTENER_POLL_S = 0.1
# How often, while anything waits for hps consume, the group's committed offsets are read
# (one OffsetFetch round trip): it bounds how late holds end and how far a message's
# recorded freshness can be off (half of it: Served.run_ready).
COMMITTED_CHECK_S = 0.1


def start_l1_listener(
    session: LookupSession, config: PSConfig, recorder: Recorder | None = None
) -> UpdateThread:
    """Shared mode: keep this process's L1 fresh from the update topics (no L2/L3 writes)."""
    check_enabled(config)
    us = config.update_source
    refresher = L1Refresher(session)
    served = Served(recorder or PrometheusRecorder())
    consumed = consumed_models(config)
    tables = {
        name: spec
        for name, spec in session.tables.items()
        if refresher.tracks(name) and consumed(spec.model)
    }
    router = version_router(config, tables, own=True)

    def new_source() -> MessageSource:
        # The service's group id lets ``committed`` read how far hps consume has applied.
        return MessageSource(
            us.brokers,
            topics_of(tables),
            mode="tail",
            group_id=us.hps_group_id,
            config=us.kafka_settings,
        )

    source = new_source()
    lost = False  # the client hit a fatal error: a new one is made at the next step
    last_check = 0.0
    previous_ns: int | None = None  # when the committed offsets were last read

    def step(stop: threading.Event) -> None:
        nonlocal source, lost, last_check, previous_ns
        router.refresh()
        if lost:  # made here, not where it was lost: a broker away fails this, retried
            source = new_source()
            lost = False
        try:
            msg = source.poll(LISTENER_POLL_S)
            msgs = [msg, *source.drain(255)] if msg is not None else []
        except ClientLost:
            # For good: a new client reads on from the group's committed offsets, and what
            # this one missed may be in L1: its rows come from L2/L3 again.
            with contextlib.suppress(Exception):  # whatever a broken client says on closing
                source.close()
            refresher.drop_all()
            lost = True
            raise
        try:
            refresh_from(msgs, router, refresher, us.hps_max_version_ahead_s, served)
        except Exception:
            # Unforeseen: some of these updates may not have reached L1, and nothing says
            # which keys they touched. L1 is a cache: its rows come from L2/L3 again.
            log.error("L1 listener: %d messages not applied to L1: dropping it", len(msgs))
            refresher.drop_all()
            raise
        now = time.monotonic()
        if (refresher.pending or served.waiting) and now - last_check >= COMMITTED_CHECK_S:
            last_check = now
            try:
                asked_ns = time.time_ns()
                ready = applied_by_group(source.committed())
                served.run_ready(ready, previous_ns)
                previous_ns = asked_ns
                timed_pass2(served.recorder, refresher, ready)
            except HPSError as exc:  # broker or L2 away: pass 2 waits, pass 1 goes on
                log.warning("L1 listener: %s; retrying", exc)

    def close() -> None:
        refresher.release_all()
        source.close()

    return UpdateThread("hps-l1-listener", step, refresher, close=close)


def applied_by_group(committed: dict[tuple[str, int], int]) -> Ready:
    """Whether the consumer group has committed past an offset."""

    def ready(token: Offset | None) -> bool:
        if token is None:
            return True
        return committed.get((token.topic, token.partition), -1) > token.offset

    return ready


@dataclass
class _Part:
    """One message's part for one table here: its keys, its stored rows (None: deleted)."""

    token: Offset
    keys: Keys
    rows: Stored | None
    published_ns: int | None


def refresh_from(
    msgs: Sequence[Message],
    router: Router,
    refresher: L1Refresher,
    ahead_s: float,
    served: Served | None = None,
) -> None:
    """Pass 1 for the messages of one poll (and pass 2 scheduled), per table they go to here.

    Per table, one update of the upserted keys (a key's last row wins) and then one eviction
    of the deleted ones, whatever their order: pass 1 only changes resident keys, so a key
    deleted anywhere in the poll ends out of L1 either way, and one upserted only ends with
    its last row. Holds and pass 2 go per table and partition, up to the poll's last offset.
    (One message at a time cost 106 us of Python a message, three lock takes and a hold each,
    against 26 us a message for polls of 256.)
    """
    parts: dict[str, list[_Part]] = {}
    for msg in msgs:
        try:
            inc = read_message(msg, max_version_ahead_s=ahead_s)
            specs = router.route(inc.model, inc.table, inc.tag, inc.ts_ms)
            found, _ = batches_for(inc, specs)  # what the consumer applies (the rest it refuses)
        except (FormatError, RequestError) as exc:
            where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
            log.debug("listener skips %s: %s", where, exc)
            continue
        token = Offset(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
        by_name = {spec.name: spec for spec in specs}
        for upd in found:
            spec = by_name[upd.table]
            rows = None if upd.delete or upd.values is None else encode_rows(spec, upd.values)
            published = upd.extras.get("published_ns")
            part = _Part(token, upd.keys, rows, None if published is None else int(published))
            parts.setdefault(upd.table, []).append(part)
    for table, table_parts in parts.items():
        _pass_one(table, table_parts, refresher, served)


def _pass_one(
    table: str, parts: list[_Part], refresher: L1Refresher, served: Served | None
) -> None:
    # Held before pass 1 writes: a fill that reads L2/L3 (not yet holding the update)
    # between pass 1 and the hold would otherwise cache the older row until pass 2.
    lanes: dict[tuple[str, int], list[_Part]] = {}
    for p in parts:
        lanes.setdefault((p.token.topic, p.token.partition), []).append(p)
    for lane in lanes.values():  # a partition's messages come in offset order
        keys = np.concatenate([p.keys for p in lane])
        refresher.later(table, keys, lane[-1].token, held=True)
    upserts = [p for p in parts if p.rows is not None]
    if upserts:
        rows = np.concatenate([p.rows for p in upserts if p.rows is not None])
        refresher.now(table, np.concatenate([p.keys for p in upserts]), rows)
    deleted = [p.keys for p in parts if p.rows is None]
    if deleted:
        refresher.now(table, np.concatenate(deleted), None)
    if served is None:
        return
    timed = [p for p in parts if p.published_ns is not None and p.keys.size]
    if not timed:
        return
    resident = refresher.resident(table, np.concatenate([p.keys for p in timed]))
    at = 0
    for p in timed:
        here, at = resident[at : at + p.keys.size], at + p.keys.size
        assert p.published_ns is not None
        if p.rows is not None and here.all():
            served.now(table, p.published_ns)  # served from L1 from now on
        else:  # some key is read from L2/L3: served once hps consume has applied it
            served.after(table, p.published_ns, p.token)

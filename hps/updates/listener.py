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
import numpy.typing as npt

from hps.config import PSConfig
from hps.errors import ClientLost, FormatError, HPSError, RequestError
from hps.rowformat import Stored
from hps.tiers import encode_rows
from hps.types import Keys, Mask
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
# Keys whose newest update version pass 1 remembers (:class:`NewestTaken`), all tables
# together: a direct-mapped record of 20 bytes a slot (5 MiB a serving process, allocated
# at its first update).
NEWEST_SLOTS = 1 << 18


def start_l1_listener(
    session: LookupSession, config: PSConfig, recorder: Recorder | None = None
) -> UpdateThread:
    """Shared mode: keep this process's L1 fresh from the update topics (no L2/L3 writes)."""
    check_enabled(config)
    us = config.update_source
    refresher = L1Refresher(session)
    served = Served(recorder or PrometheusRecorder())
    newest = NewestTaken()
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
    # The source starts at the group's committed offsets as they are now: rows L1 loaded
    # before (the warm-up) may predate updates committed since; L2/L3 hold those.
    reread = refresher.reread(tables)
    if reread:
        log.info("L1 listener: %d resident rows re-read from L2/L3 at its start", reread)
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
            refresh_from(msgs, router, refresher, us.hps_max_version_ahead_s, served, newest)
        except Exception:
            # Unforeseen: some of these updates may not have reached L1, and nothing says
            # which keys they touched. L1 is a cache: its rows come from L2/L3 again, and a
            # new client reads on from the group's committed offsets, so those updates come
            # again (hps consume may not have applied them: a refill would read the old rows).
            log.error("L1 listener: %d messages not applied to L1: dropping it", len(msgs))
            with contextlib.suppress(Exception):
                source.close()
            refresher.drop_all()
            lost = True
            raise
        now = time.monotonic()
        waiting = refresher.pending or refresher.owed or served.waiting
        if waiting and now - last_check >= COMMITTED_CHECK_S:
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


class NewestTaken:
    """The highest update version pass 1 took for each recently updated key of any table,
    so that a later message with an older version (another partition, a producer's retry)
    does not overwrite the newer row L1 already serves: ``hps consume`` refuses it in L2/L3
    too.

    Bounded: ``slots`` (a power of two) for all tables together, a key's slot a hash of it
    and its table; a key whose slot another key took since is forgotten (its next update is
    taken whatever its version, and pass 2 re-reads the newest row from L2/L3 as before)."""

    def __init__(self, slots: int = NEWEST_SLOTS) -> None:
        if slots < 2 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two >= 2, not {slots}")
        self.slots = slots
        self._shift = np.uint64(64 - (slots.bit_length() - 1))
        self._ids: dict[str, int] = {}  # table -> its id in the record (1, 2, ...)
        self._record: (
            tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.int32]] | None
        ) = None

    def _slot(self, table_id: int, keys: Keys) -> npt.NDArray[np.intp]:
        h = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) + np.uint64(table_id)
        return ((h * _GOLDEN) >> self._shift).astype(np.intp)  # wraps

    def take(self, table: str, keys: Keys, versions: npt.NDArray[np.uint64]) -> Mask:
        """Which of ``keys`` (distinct) come with a version >= the newest taken for them (or
        none known); those are recorded as taken."""
        if self._record is None:
            n = self.slots
            self._record = (np.zeros(n, np.int64), np.zeros(n, np.uint64), np.zeros(n, np.int32))
        stored_keys, stored_versions, stored_tables = self._record
        table_id = self._ids.setdefault(table, len(self._ids) + 1)
        slot = self._slot(table_id, keys)
        known = (stored_tables[slot] == table_id) & (stored_keys[slot] == keys)
        take = ~known | (versions >= stored_versions[slot])
        stored_keys[slot[take]] = keys[take]
        stored_versions[slot[take]] = versions[take]
        stored_tables[slot[take]] = table_id
        return np.asarray(take, dtype=bool)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class _Part:
    """One message's part for one table here: its keys, its stored rows (None: deleted),
    its update version."""

    token: Offset
    keys: Keys
    rows: Stored | None
    published_ns: int | None
    version: int


def refresh_from(
    msgs: Sequence[Message],
    router: Router,
    refresher: L1Refresher,
    ahead_s: float,
    served: Served | None = None,
    newest: NewestTaken | None = None,
) -> None:
    """Pass 1 for the messages of one poll (and pass 2 scheduled), per table they go to here.

    Per table, each key's row of the highest update version (the later one among equal
    versions, as ``hps consume`` merges a batch), and only where that version is >= the
    newest ``newest`` recorded for the key in an earlier poll (None: this poll's only): one
    update of the upserted keys (resident ones only) and one eviction of the deleted ones.
    Holds and pass 2 go per table and partition, up to the poll's last offset, for every key.
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
            ns = None if published is None else int(published)
            parts.setdefault(upd.table, []).append(_Part(token, upd.keys, rows, ns, upd.version))
    newest = newest or NewestTaken(slots=2)  # none: what this poll takes only
    for table, table_parts in parts.items():
        _pass_one(table, table_parts, refresher, served, newest)


def _pass_one(
    table: str,
    parts: list[_Part],
    refresher: L1Refresher,
    served: Served | None,
    newest: NewestTaken,
) -> None:
    # Held before pass 1 writes: a fill that reads L2/L3 (not yet holding the update)
    # between pass 1 and the hold would otherwise cache the older row until pass 2.
    lanes: dict[tuple[str, int], list[_Part]] = {}
    for p in parts:
        lanes.setdefault((p.token.topic, p.token.partition), []).append(p)
    for lane in lanes.values():  # a partition's messages come in offset order
        keys = np.concatenate([p.keys for p in lane])
        refresher.later(table, keys, lane[-1].token, held=True)
    keys, versions, row_at = _newest_rows(parts)
    take = newest.take(table, keys, versions)
    keys, row_at = keys[take], row_at[take]
    upserted = row_at >= 0
    if upserted.any():
        rows = np.concatenate([p.rows for p in parts if p.rows is not None])
        refresher.now(table, keys[upserted], rows[row_at[upserted]])
    if not upserted.all():
        refresher.now(table, keys[~upserted], None)
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


def _newest_rows(
    parts: list[_Part],
) -> tuple[Keys, npt.NDArray[np.uint64], npt.NDArray[np.intp]]:
    """Each distinct key of ``parts`` once, with its row of the highest version (the later
    one among equal versions): the key, the version, and where its row lies in the upserts'
    rows concatenated (-1: a delete)."""
    sizes = np.array([p.keys.size for p in parts], dtype=np.intp)
    keys = np.concatenate([p.keys for p in parts]).astype(np.int64, copy=False)
    versions = np.repeat(np.array([p.version for p in parts], dtype=np.uint64), sizes)
    upsert = np.array([p.rows is not None for p in parts], dtype=bool)
    first_key = np.cumsum(sizes) - sizes  # where each part's keys start
    first_row = np.cumsum(np.where(upsert, sizes, 0)) - np.where(upsert, sizes, 0)
    row_at = np.arange(keys.size, dtype=np.intp) + np.repeat(first_row - first_key, sizes)
    row_at[~np.repeat(upsert, sizes)] = -1
    order = np.lexsort((np.arange(keys.size), versions, keys))  # by key, version, arrival
    last = np.ones(order.size, dtype=bool)
    last[:-1] = keys[order[1:]] != keys[order[:-1]]
    win = order[last]
    return keys[win], versions[win], row_at[win]

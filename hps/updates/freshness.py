"""Fresh L1 caches: serving processes learn which keys changed and refresh the resident ones.

Two passes per update message (docs/updates.md, "Freshness"):

1. **At once**, from the message itself: resident rows get the new rows (in the table's
   stored form: the applier's, or the message's vectors encoded), deleted keys leave L1. A
   lookup then returns the new vector within the time the message takes to reach the
   process (broker fetch wait + decode), without waiting for L2/L3.
2. **Once L2/L3 hold the update** (``ready``; for a shared L2 that is when the consumer group
   has committed past the message) and ``grace_s`` later, the resident rows of the same keys
   are re-read from L2/L3. This catches a key that a concurrent lookup loaded from L2 *before*
   the update reached L2 (it missed pass 1 because it was not resident yet), and an out-of-
   order older message whose vectors pass 1 installed: L2/L3 keep the newest version.

Where L2/L3 are written by another process (``hps consume``), pass 1 also holds the keys
(``held``, :meth:`hps.cache.EmbeddingCache.hold`) until ``ready``: a lookup that reads one of
them from L2 meanwhile serves it but does not cache it, so the next lookup reads L2 again
and returns the update as soon as L2 has it, not only at pass 2.

:class:`Served` records when the process serves each message (``hps_update_freshness_seconds``):
at pass 1 when every key of the message is resident in L1 after it, else when L2/L3 came to
hold the message (the same ``ready`` as pass 2, without the grace). ``ready`` is polled: the
middle of the interval in which it turned true is recorded, never a moment before pass 1.

What waits for ``ready`` is queued per topic partition (:class:`Offset`): a consumer group
commits a partition in offset order, so a check asks each partition's queue only until the
first message that is not ready yet. A check costs what it finds ready, not what waits
(100,000 messages while ``hps consume`` lags, asked every 0.1 s).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hps.cache.refresh import MAX_SLICE
from hps.rowformat import Stored
from hps.types import Keys, Mask
from hps.updates import metrics
from hps.updates.metrics import Recorder

if TYPE_CHECKING:
    from hps.lookup import LookupSession

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 0.5
MAX_PENDING_KEYS = 1 << 22
MAX_WAITING = 100_000  # messages whose freshness waits for L2/L3
# Keys one pass 2 re-reads at most (the messages that are due, merged per table): the
# listener goes back to polling between passes.
MAX_PASS_KEYS = 1 << 16


class Offset(NamedTuple):
    """Where an update message was read: ``ready`` turns true along a partition in offset
    order (the partition's committed offset passes it)."""

    topic: str
    partition: int
    offset: int


Ready = Callable[[Offset | None], bool]
"""Whether L2/L3 hold the update at an offset (``None``: nothing to wait for)."""


def always_ready(token: Offset | None) -> bool:
    """The ``ready`` of a process that writes L2/L3 itself: nothing to wait for."""
    return True


@dataclass
class _Pending:
    table: str
    keys: Keys
    token: Offset | None  # handed to ``ready``
    since: float
    hold: int | None = None  # the cache's hold on ``keys``, released once ``ready``


class L1Refresher:
    """Applies both passes to a LookupSession's L1 caches (``session.caches``)."""

    def __init__(self, session: LookupSession, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.session = session
        self.grace_s = grace_s
        self._pending: deque[_Pending] = deque()
        self._pending_keys = 0
        self._holding: dict[tuple[str, int], deque[_Pending]] = {}  # holds, per partition
        # Pass 2s given up (the queue full): their tables are re-read whole once every
        # partition has passed the newest of them (owed_tokens, per partition)
        self._owed_tables: set[str] = set()
        self._owed_tokens: dict[tuple[str, int], Offset] = {}

    def tracks(self, table: str) -> bool:
        return self.session.caches.get(table) is not None

    def now(self, table: str, keys: Keys, rows: Stored | None) -> None:
        """Pass 1: ``rows`` (stored rows of the table's format) for upserts, ``None`` for
        deletes. Only resident keys change (an upsert never inserts); they are counted in
        ``hps_updates_l1_refreshed_keys_total``, each distinct key once."""
        cache = self.session.caches.get(table)
        if cache is None or keys.size == 0:
            return
        if rows is None:
            keys = np.unique(keys)
            held = int(np.count_nonzero(cache.resident(keys)))
            cache.evict(keys)
        else:  # the cache checks the rows' format and says which keys it held
            held = int(np.count_nonzero(cache.update(keys, rows)))
        if held:
            metrics.L1_REFRESHED.labels(table).inc(held)

    def resident(self, table: str, keys: Keys) -> Mask:
        """Which keys are in L1 (after pass 1: they are served from there)."""
        cache = self.session.caches.get(table)
        if cache is None:
            return np.zeros(keys.size, dtype=bool)
        return np.asarray(cache.resident(keys), dtype=bool)

    def later(
        self, table: str, keys: Keys, token: Offset | None = None, *, held: bool = False
    ) -> None:
        """Queue pass 2 for ``keys``; it runs when ``ready(token)`` holds (see :meth:`run_due`).
        ``held``: keep them out of L1 fills until then (L2/L3 may not hold the update yet)."""
        cache = self.session.caches.get(table)
        if cache is None or keys.size == 0:
            return
        hold = cache.hold(keys) if held and token is not None else None
        entry = _Pending(table, keys, token, time.monotonic(), hold)
        self._pending.append(entry)
        self._pending_keys += keys.size
        if token is not None and hold is not None:
            self._holding.setdefault((token.topic, token.partition), deque()).append(entry)
        while self._pending_keys > MAX_PENDING_KEYS:  # L2/L3 writer gone for long
            old = self._pending.popleft()
            self._pending_keys -= old.keys.size
            self._release(old)
            if not self._owed_tables:
                log.warning(
                    "L1 re-read queue full (L2/L3's writer away?): the resident rows of %s "
                    "are re-read whole once it catches up",
                    old.table,
                )
            self._owed_tables.add(old.table)
            if old.token is not None:
                self._owed_tokens[(old.token.topic, old.token.partition)] = old.token

    def _release(self, entry: _Pending) -> None:
        if entry.hold is not None:
            cache = self.session.caches.get(entry.table)
            if cache is not None:
                cache.release(entry.hold)
            entry.hold = None

    def drop_all(self) -> None:
        """Evict every row of every L1, a slice per lock hold: what is left when updates
        may have been missed and nothing says which keys they touched. Each cache's
        ``barrier`` comes first, so a fill whose read came before this call is dropped
        even where it lands after the listing of the resident keys (call this once L2/L3
        hold the updates: after a catch-up, a refill)."""
        for cache in self.session.caches.values():
            cache.barrier()
            keys = cache.resident_keys()
            for lo in range(0, keys.size, MAX_SLICE):
                cache.evict(keys[lo : lo + MAX_SLICE])

    def reread(self, tables: Iterable[str]) -> int:
        """Re-read every resident row of ``tables`` from L2/L3, a slice per lock hold (each
        cache's ``barrier`` first); the rows re-read. For rows L1 loaded before the
        listener took its start (a warm-up): updates ``hps consume`` applied and committed
        before that start are never read from the topics again, but L2/L3 hold them."""
        before_l3 = self.session.tiers.catch_up_once()
        done = 0
        for table in tables:
            cache = self.session.caches.get(table)
            if cache is None:
                continue
            cache.barrier()
            keys = cache.resident_keys()
            for lo in range(0, keys.size, MAX_SLICE):
                self.session.refresh(table, keys[lo : lo + MAX_SLICE], before_l3=before_l3)
            done += int(keys.size)
        return done

    def _pay_owed(self, ready: Ready) -> None:
        """The pass 2s given up when the queue was full: once L2/L3 hold every update they
        were for, every resident row of their tables is re-read (a row a lookup filled from
        L2/L3 before then, stale, is corrected)."""
        if not self._owed_tables or not all(ready(t) for t in self._owed_tokens.values()):
            return
        tables = sorted(self._owed_tables)
        rows = self.reread(tables)  # raises: owed still, tried again at the next pass
        self._owed_tables.clear()
        self._owed_tokens.clear()
        log.info("L1 re-read %d resident rows of %s, whose updates overflowed the re-read "
                 "queue", rows, ", ".join(tables))  # fmt: skip

    @property
    def owed(self) -> set[str]:
        """Tables whose resident rows are to be re-read whole (see :meth:`run_due`)."""
        return set(self._owed_tables)

    def release_all(self) -> None:
        """End every hold (the listener stops: nothing will say when L2/L3 are ready)."""
        for entry in self._pending:
            self._release(entry)
        self._holding.clear()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def run_due(self, ready: Ready = always_ready) -> int:
        """Pass 2 for the queued updates that are old enough and ready, in order, up to
        ``MAX_PASS_KEYS`` keys: their keys merged per table and re-read in slices (one
        re-read per table, not per message); returns how many updates. Holds end as soon as
        their update is ready. If a re-read raises, every update of the pass stays queued."""
        for lane, queue in list(self._holding.items()):
            while queue and (queue[0].hold is None or ready(queue[0].token)):
                self._release(queue.popleft())
            if not queue:
                del self._holding[lane]
        self._pay_owed(ready)
        deadline = time.monotonic() - self.grace_s
        due: list[_Pending] = []
        n_keys = 0
        while self._pending and self._pending[0].since <= deadline and n_keys < MAX_PASS_KEYS:
            if not ready(self._pending[0].token):
                break
            due.append(self._pending.popleft())
            n_keys += due[-1].keys.size
        if not due:
            return 0
        # A secondary L3 sees the writer's updates only after catching up: once per pass, and
        # only if some key is not in L2 (with Redis holding every row, never).
        before_l3 = self.session.tiers.catch_up_once()
        by_table: dict[str, list[Keys]] = {}
        for entry in due:
            by_table.setdefault(entry.table, []).append(entry.keys)
        try:
            for table, parts in by_table.items():
                keys = np.unique(np.concatenate(parts))
                for lo in range(0, keys.size, MAX_SLICE):  # a slice per lock hold
                    self.session.refresh(table, keys[lo : lo + MAX_SLICE], before_l3=before_l3)
        except BaseException:
            self._pending.extendleft(reversed(due))  # all queued again: a re-read repeats
            raise
        for entry in due:
            self._release(entry)  # ready: already released, unless it came out of order
        self._pending_keys -= n_keys
        return len(due)


class Served:
    """Freshness of each update message in a serving process: publish timestamp -> served.

    :meth:`now` for a message served at once (its keys resident in L1 after pass 1, or an
    embedded applier that has applied it); :meth:`after` for one served once L2/L3 hold it,
    observed by :meth:`run_ready` when ``ready(token)`` says so. One entry per message, not
    per key; at most ``limit`` wait (past that, each new one drops the oldest of its partition:
    L2/L3's writer is away for long).

    ``ready`` is polled, so the moment a message was first served is known only to lie
    between the later of the previous check (``run_ready``'s ``previous_ns``) and the
    message's pass 1, and this check: the middle of that interval is recorded (the same
    estimate as the load test's ``kafka visible``). Checking every ``c`` seconds, it is off
    by at most ``c / 2`` either way, where this check's own time would be up to ``c`` late."""

    def __init__(self, recorder: Recorder, *, limit: int = MAX_WAITING) -> None:
        self.recorder = recorder
        self.limit = limit
        # per partition, in offset order: (table, published_ns, offset, seen_ns)
        self._waiting: dict[tuple[str, int], deque[tuple[str, int, Offset, int]]] = {}
        self._count = 0

    @property
    def waiting(self) -> int:
        return self._count

    def now(self, table: str, published_ns: int) -> None:
        self.recorder.fresh(table, published_ns)

    def after(self, table: str, published_ns: int, token: Offset) -> None:
        queue = self._waiting.setdefault((token.topic, token.partition), deque())
        queue.append((table, published_ns, token, time.time_ns()))
        self._count += 1
        if self._count > self.limit:  # the writer is away for long: this partition's oldest
            queue.popleft()
            self._count -= 1

    def run_ready(self, ready: Ready, previous_ns: int | None = None) -> int:
        """Observe every waiting message that ``ready`` now holds; returns how many.
        ``previous_ns``: when ``ready`` was last asked (``time.time_ns()``), if ever."""
        now_ns = time.time_ns()
        done = 0
        for lane, queue in list(self._waiting.items()):
            while queue and ready(queue[0][2]):
                table, published_ns, _, seen_ns = queue.popleft()
                since = seen_ns if previous_ns is None else max(seen_ns, previous_ns)
                self.recorder.fresh(table, published_ns, (min(since, now_ns) + now_ns) // 2)
                done += 1
            if not queue:
                del self._waiting[lane]
        self._count -= done
        return done

"""A serving process's follower of its node's change journal (:mod:`hps.updates.journal`):
it tails the journal and applies each entry to its session, and keeps its reader cursor
(position and heartbeat) up to date.

Every :data:`FOLLOW_S` the follower looks whether the head changed (one ``stat``), at least
every :data:`~hps.updates.journal.POLL_S` it polls, and does what a Kafka update does to
the session. A control-plane change: a secondary L3 catches up, an L2 of its own forgets
the keys, resident L1 rows are re-read (upserts) or evicted (deletes), with a second re-read
``grace_s`` later (:class:`hps.updates.freshness.L1Refresher`); warm-up keys are loaded
into L1, :data:`WARMUP_CHUNK` at a time. A change ``hps consume`` appended (L2/L3 hold it
already) carries its rows: resident L1 rows take them at once (pass 1, nothing read), then
the same second re-read; each of its updates' freshness is recorded (the moment this process
serves it: when its rows reached L1 if any key was resident, else when L2/L3 held it).

An entry it needs gone (it fell behind), one it cannot read or apply (another release
wrote it; a tier failing aside: that poll is tried again) or a new generation (the folder
was recreated) makes it drop its whole L1 and refill an L2 of its own from L3. Its cursor,
with the ``problem`` it was asked to :meth:`JournalFollower.report` (or, while its polls
fail, why), is rewritten at least every :data:`~hps.updates.journal.HEARTBEAT_S` and at
once when it moves or the problem changes: ``/readyz`` says 503 with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from hps.cache.refresh import MAX_SLICE
from hps.cache.warmup import WARMUP_CHUNK, load_slices
from hps.errors import BackendError
from hps.updates.journal import HEARTBEAT_S, POLL_S, Change, Journal

if TYPE_CHECKING:
    from hps.lookup import LookupSession
    from hps.updates.freshness import L1Refresher
    from hps.updates.metrics import Recorder

log = logging.getLogger(__name__)

FOLLOW_S = 0.02  # how often the head's stat is compared: what an update waits here at most


class JournalFollower:
    """One serving process's view of the journal: applies new entries to its session.

    Create it *before* the session is built (it starts at the journal's head then, so
    nothing written while the process starts is missed); :meth:`attach` the session, then
    :meth:`start` the thread (or call :meth:`poll` yourself).
    """

    def __init__(self, journal: Journal, reader: str, model: str) -> None:
        self.journal = journal
        self.reader = re.sub(r"[^A-Za-z0-9_.-]", "_", reader)
        self.model = model
        self.generation, self.seq = journal.head()
        self.resyncs = 0
        self.applied = 0
        self._session: LookupSession | None = None
        self._refresher: L1Refresher | None = None
        self._own_l2 = False
        self._clear_l2 = False
        self._l2_share = 1.0
        self._beat = 0.0
        self._problem_of: Callable[[], str | None] | None = None
        self._problem: str | None = None
        self._failing: str | None = None  # why the last poll failed, while it does
        self._recorder: Recorder | None = None
        self._stamp: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat()

    def attach(
        self,
        session: LookupSession,
        *,
        own_l2: bool,
        shared_backfill: bool,
        l2_share: float = 1.0,
        recorder: Recorder | None = None,
    ) -> None:
        """``own_l2``: the session's L2 lives in this process (nobody else updates it);
        ``shared_backfill``: the session backfills a shared L2 from L3 (it then removes the
        changed keys from it once its L3 has caught up, undoing a stale backfill);
        ``recorder``: takes the freshness of the updates ``hps consume`` journals."""
        from hps.updates.freshness import L1Refresher

        self._recorder = recorder
        self._session = session
        self._refresher = L1Refresher(session)
        tiers = session.tiers
        self._own_l2 = own_l2 and tiers.volatile is not None and tiers.persistent is not None
        self._clear_l2 = self._own_l2 or (shared_backfill and session.tiers.volatile is not None)
        self._l2_share = l2_share

    def report(self, problem: Callable[[], str | None]) -> None:
        """Carry ``problem()`` (None: the process can serve) in this follower's heartbeat,
        asked on every poll; a change is written at once (``/readyz`` reads it)."""
        self._problem_of = problem
        self._heartbeat()

    def _heartbeat(self, force: bool = True) -> None:
        now = time.monotonic()
        problem = self._problem_now()
        if force or problem != self._problem or now - self._beat >= HEARTBEAT_S:
            self.journal.write_cursor(self.reader, self.model, self.generation, self.seq, problem)
            self._problem = problem
            self._beat = now

    def _problem_now(self) -> str | None:
        if self._failing is not None:
            return self._failing
        if self._problem_of is None:
            return None
        try:
            return self._problem_of()
        except Exception as exc:  # a failing report is itself a problem, never a dead follower
            return f"cannot tell whether this process can serve: {type(exc).__name__}: {exc}"

    def poll(self) -> int:
        """Apply the entries written since the last poll; how many."""
        session = self._session
        assert session is not None and self._refresher is not None, "attach a session first"
        generation, head = self.journal.head()
        done = 0
        moved = generation != self.generation or head != self.seq
        if generation != self.generation:
            log.warning("change journal recreated: dropping L1 (any change may be missed)")
            self._resync(session)
            self.generation, self.seq = generation, head
        elif head > self.seq:
            done = self._apply_entries(session, head)
            self.seq = head
            self.applied += done
        self._refresher.run_due()
        self._heartbeat(force=moved)  # else at least every HEARTBEAT_S
        return done

    def _apply_entries(self, session: LookupSession, head: int) -> int:
        """Apply the entries after ``self.seq`` up to ``head``; how many. An entry that
        cannot be read or applied (a tier failing aside, which is tried again at the next
        poll) drops L1 instead, as one that is gone does: its changes are then read from
        L2/L3, and the entries after it are not held up behind it."""
        entries = []
        try:
            for seq in range(self.seq + 1, head + 1):
                entry = self.journal.read(seq)
                if entry is None:
                    log.warning("change journal: fell behind (entries removed): dropping L1")
                    self._resync(session)
                    return 0
                entries.append(entry)
            if any(not c.from_updates for e in entries for c in e.changes):
                session.tiers.catch_up()  # once for all the entries: L3 as they describe
            for entry in entries:
                for change in entry.changes:
                    self._apply(session, change, entry.time_ns)
        except BackendError:
            raise
        except Exception:
            log.exception("change journal: entries %d-%d not applied: dropping L1", self.seq + 1,
                          head)  # fmt: skip
            self._resync(session)
            return 0
        return len(entries)

    def _apply(self, session: LookupSession, change: Change, appended_ns: int) -> None:
        spec = session.tables.get(change.table)
        if spec is None:
            return  # another model's table
        if change.from_updates:
            self._apply_update(session, change, appended_ns)
            return
        assert self._refresher is not None
        if change.keys is None:  # every key of the table
            if self._own_l2:
                self._refill_l2(session, change.table)
            cache = session.caches.get(change.table)
            keys = np.empty(0, np.int64)
            if cache is not None:  # a fill that read before the change is dropped, not listed
                cache.barrier()
                keys = cache.resident_keys()
        else:
            keys = change.keys
            if self._clear_l2 and change.kind != "warmup":
                l2, writes = session.tiers.volatile, session.tiers.l2_writes
                assert l2 is not None and writes is not None
                with writes.writing(change.table, keys):  # a backfill read before it skips them
                    l2.remove(change.table, keys)
        if change.kind == "warmup":
            cache = session.caches.get(change.table)
            capacity = cache.capacity if cache is not None else 0
            for part in load_slices(keys, capacity, WARMUP_CHUNK):
                session.warm_up(change.table, part)
            return
        if change.kind == "delete":
            self._refresher.now(change.table, keys, None)
        else:  # resident rows re-read (L3 caught up), a slice per lock hold
            for lo in range(0, keys.size, MAX_SLICE):
                session.refresh(change.table, keys[lo : lo + MAX_SLICE])
        self._refresher.later(change.table, keys)  # and again once any stale backfill is undone

    def _apply_update(self, session: LookupSession, change: Change, appended_ns: int) -> None:
        """A batch hps consume applied: L2/L3 hold it, its rows come with it."""
        assert self._refresher is not None and change.keys is not None
        start, now_ns = time.perf_counter(), time.time_ns()
        cache = session.caches.get(change.table)
        resident = cache is not None and bool(cache.resident(change.keys).any())
        self._refresher.now(change.table, change.keys, change.rows)  # rows None: deleted
        self._refresher.later(change.table, change.keys)
        if self._recorder is None:
            return
        self._recorder.age("journal", appended_ns, now_ns)
        self._recorder.stage("l1_refresh", time.perf_counter() - start)
        served_ns = time.time_ns() if resident else appended_ns
        for published in change.published_ns:
            self._recorder.fresh(change.table, published, served_ns)

    def _refill_l2(self, session: LookupSession, table: str) -> None:
        l2, writes = session.tiers.volatile, session.tiers.l2_writes
        assert l2 is not None and writes is not None
        with writes.writing(table, None):  # backfills of rows read before it are dropped
            l2.drop_table(table)
            l2.open_table(session.tables[table])
            session.tiers.fill_l2_from_l3(table, self._l2_share)

    def _resync(self, session: LookupSession) -> None:
        """Fell behind: catch L3 up, refill an L2 of our own, drop every L1 row."""
        self.resyncs += 1
        session.tiers.catch_up()
        if self._own_l2:
            for table in session.tables:
                self._refill_l2(session, table)
        assert self._refresher is not None
        self._refresher.drop_all()

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> JournalFollower:
        self._thread = threading.Thread(target=self._run, name="hps-journal", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(FOLLOW_S):
            try:
                now = time.monotonic()
                if not self._head_moved() and now - last < POLL_S:
                    continue
                last = now
                self.poll()
                self._failing = None
            except Exception as exc:  # noqa: BLE001 - a tier hiccup must not end the follower
                if self._failing is None:
                    log.exception("change journal: poll failed; retrying")
                # /readyz says why, and the cursor stays live while the poll is retried
                self._failing = f"change journal: {type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    self._heartbeat(force=False)
                self._stop.wait(1.0)

    def _head_moved(self) -> bool:
        """Whether head.json was rewritten since the last look (it is replaced atomically:
        a new inode each time; one that reuses the inode within the clock's tick is seen at
        the next POLL_S)."""
        stamp = self.journal.head_stamp()
        moved = stamp != self._stamp
        self._stamp = stamp
        return moved

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.journal.remove_cursor(self.reader)

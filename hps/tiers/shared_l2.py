"""Keep a process on its node's current shared-memory L2 (``multi_process_hash_map``).

When the segment a process holds is removed or replaced (its name points at another file),
the store moves to the current one (:meth:`SharedHashMapStore.follow`) and a
:class:`SharedL2Watch` refills it from L3, has L1 re-read its resident rows (a callback of
the process: the watch knows no cache) and reports not-ready (:meth:`SharedL2Watch.problem`)
until that is done. Who refills: the process that applies updates to L3 (``hps consume``,
``fill="overwrite"``, in its loop between batches, so no update can come between the rows it
reads from L3 and the ones it writes); with no such process (no Kafka) the serving
processes, the first to find a table empty (``fill="if_empty"``, under the node's import
lock, as the start-up fill). A finished fill is recorded in the segment; every watch has L1
re-read when it sees a new one. A serving process that leaves the refill to ``hps consume``
(``fill="none"``) reports not-ready from its move until the new segment records a finished
fill (the consumer's): until then its misses go to an L3 that may lag the consumer's.
:func:`hps.startup.watch_shared_l2` builds the watch of a lookup session.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Literal

from hps.errors import HPSError
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.tiers.tiers import Tiers
from hps.types import TableSpec

log = logging.getLogger(__name__)

FillMode = Literal["overwrite", "if_empty", "none"]
"""How a :class:`SharedL2Watch` refills a new segment: every table from L3 (the process that
writes L3), the tables it finds empty (serving processes where nothing else writes), none
(serving processes while ``hps consume`` refills)."""

WATCH_INTERVAL_S = 1.0
"""How often a watch checks the segment's identity (an ``os.stat``, an 8-byte read)."""


def shared_l2(tiers: Tiers) -> SharedHashMapStore | None:
    """The shared-memory store of ``tiers``' L2, when its L2 is one."""
    store = tiers.volatile.backend_store if tiers.volatile is not None else None
    return store if isinstance(store, SharedHashMapStore) else None


class SharedL2Watch:
    """Keeps one process on its node's current shared-memory L2 (see the module docstring).

    :meth:`check` is cheap and may be called on every pass of a loop (it acts at most every
    ``interval_s``); :meth:`start` runs it in a daemon thread instead. ``refresh_l1``: has
    the process's L1 re-read its resident rows; ``lock``: the node's import lock, taken
    around an ``if_empty`` fill.
    """

    def __init__(
        self,
        store: SharedHashMapStore,
        tiers: Tiers,
        tables: Sequence[TableSpec],
        *,
        fill: FillMode,
        share: float = 1.0,
        refresh_l1: Callable[[], None] | None = None,
        lock: Callable[[], AbstractContextManager[object]] | None = None,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.store = store
        self.tiers = tiers
        self.tables = list(tables)
        self.fill = fill
        self.share = share
        self.refresh_l1 = refresh_l1
        self.lock = lock
        self.interval_s = interval_s
        self.recoveries = 0  # refills finished after a move
        self._generation = store.generation
        self._filled = store.filled()
        self._awaiting_fill = False  # moved; another process's refill not recorded yet
        # hps consume (re)started on a segment no fill reached (e.g. made by serving
        # processes that moved while it was down, who wait for its fill): fill it first
        self._first = fill == "overwrite"
        self._failure: str | None = None
        self._last = time.monotonic()
        self._busy = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def problem(self) -> str | None:
        """None while this process serves the current segment, refilled; else why not."""
        if self._failure is not None:
            return self._failure
        if self.store.generation != self._generation:
            return f"shared L2 {self.store.path} was replaced: refilling it from L3"
        if self._awaiting_fill:
            return (
                f"shared L2 {self.store.path} was replaced: waiting for hps consume to refill "
                "it from L3"
            )
        return None

    def check(self, *, force: bool = False) -> bool:
        """Follow the segment's name, refill and re-read L1 where needed (at most every
        ``interval_s`` unless ``force``); True if this call recovered from a move."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return False
        if not self._busy.acquire(blocking=False):
            return False  # another thread of this process is at it
        try:
            self._last = now
            self.store.follow()
            if self.store.generation != self._generation or self._failure is not None:
                return self._recover()
            if self._first:
                self._first = False
                if self.store.filled() == 0 and any(
                    self.store.size(s.name) == 0 for s in self.tables
                ):
                    return self._recover()
            filled = self.store.filled()
            if filled != self._filled:  # another process refilled: L1 may hold what it fixed
                self._filled = filled
                self._reread_l1()
                self._awaiting_fill = False
            return False
        finally:
            self._busy.release()

    def _recover(self) -> bool:
        generation = self.store.generation
        try:
            rows = self._fill()
            self._reread_l1()
        except HPSError as exc:
            self._failure = f"shared L2 {self.store.path} was replaced; refilling failed: {exc}"
            log.warning("%s (retrying in %g s)", self._failure, self.interval_s)
            return False
        self._generation = generation
        self._filled = self.store.filled()
        # left to another process (hps consume): not ready until the segment records its fill
        self._awaiting_fill = self.fill == "none" and self._filled == 0
        self._failure = None
        self.recoveries += 1
        log.warning(
            "shared L2 %s: back on the current segment (%d rows refilled here)",
            self.store.path,
            rows,
        )
        return True

    def _fill(self) -> int:
        if self.fill == "none" or self.tiers.persistent is None:
            return 0
        if self.fill == "overwrite":
            rows = sum(self.tiers.fill_l2_from_l3(s.name, self.share) for s in self.tables)
            self.store.mark_filled()
            return rows
        rows = 0
        with self.lock() if self.lock is not None else contextlib.nullcontext():
            empty = [s for s in self.tables if self.store.size(s.name) == 0]
            if empty:
                self.tiers.catch_up()
                rows = sum(self.tiers.fill_l2_from_l3(s.name, self.share) for s in empty)
                self.store.mark_filled()
        return rows

    def _reread_l1(self) -> None:
        if self.refresh_l1 is not None:
            self.refresh_l1()

    def start(self) -> SharedL2Watch:
        """Run :meth:`check` every ``interval_s`` in a daemon thread."""

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check(force=True)
                except Exception:  # a watch that dies would hide the next fault
                    log.exception("shared L2 watch of %s", self.store.path)

        self._thread = threading.Thread(target=loop, name="hps-shared-l2-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

"""Periodic refresh of L1 from L2/L3, as HugeCTR's ``refresh_interval`` / ``refresh_delay``.

Every ``refresh_interval`` seconds (the first time after ``refresh_delay``) the refresher
walks all resident keys of each cache and re-reads them from L2/L3 through
``refresh(table, keys)`` (``LookupSession.refresh``), one slice of
``cache_refresh_percentage_per_iteration`` x capacity keys at a time (``MAX_SLICE`` when 0),
so the cache lock is held briefly and lookups interleave. (A whole cache in one slice held
its lock for as long as the update of every resident row: 212 ms at 1 M rows of dim 16,
1.3 s at dim 128, against 0.76 and 3.1 ms for a slice of 8,192 keys, with every
request of the model waiting, since a request takes all its tables' locks together.) A key
that no lower level holds any more leaves L1. ``refresh_interval`` 0 disables it, as in
HugeCTR. Both times are at most ``MAX_REFRESH_S`` (a year), as the ps.json says: a wait
past ``threading.TIMEOUT_MAX`` would end the thread. The journal follower re-reads a whole
table in slices of ``MAX_SLICE`` too.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from hps.config.model import MAX_REFRESH_S
from hps.types import Keys

log = logging.getLogger(__name__)

RefreshFn = Callable[[str, Keys], object]
MAX_SLICE = 8192  # keys per slice when cache_refresh_percentage_per_iteration is 0


class Refreshable(Protocol):
    """What the refresher needs of a cache (:class:`hps.cache.EmbeddingCache` has it)."""

    @property
    def capacity(self) -> int: ...
    def resident_keys(self) -> Keys: ...


class Refresher:
    """Background thread refreshing the resident keys of ``caches`` every ``interval`` s."""

    def __init__(
        self,
        caches: Mapping[str, Refreshable],
        refresh: RefreshFn,
        *,
        interval: float,
        delay: float = 0.0,
        percentage: float = 0.0,
        before_pass: Callable[[], None] | None = None,
    ) -> None:
        for name, seconds in (("interval", interval), ("delay", delay)):
            if not 0.0 <= seconds <= MAX_REFRESH_S:  # NaN too
                raise ValueError(f"refresh {name} {seconds} s is not from 0 to {MAX_REFRESH_S} s")
        self.caches = caches
        self.before_pass = before_pass
        self.refresh = refresh
        self.interval = interval
        self.delay = delay
        self.percentage = percentage
        self.passes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and bool(self.caches)

    def slice_size(self, cache: Refreshable) -> int:
        """Keys per slice: ``percentage`` x capacity (``MAX_SLICE`` at most when 0)."""
        if self.percentage <= 0:
            return max(1, min(cache.capacity, MAX_SLICE))
        return max(1, math.ceil(self.percentage * cache.capacity))

    def run_pass(self) -> int:
        """Refresh every resident key of every cache once, slice by slice; returns keys done."""
        done = 0
        if self.before_pass is not None:
            self.before_pass()  # e.g. a new once-a-pass L3 catch-up (hps.startup)
        for table, cache in list(self.caches.items()):
            keys = cache.resident_keys()
            step = self.slice_size(cache)
            for lo in range(0, keys.size, step):
                if self._stop.is_set():
                    return done
                try:
                    self.refresh(table, keys[lo : lo + step])
                except Exception as exc:  # a failing tier must not kill the thread
                    log.warning("L1 refresh of %s failed: %s", table, exc)
                    break
                done += min(step, keys.size - lo)
        self.passes += 1
        return done

    def _loop(self) -> None:
        if self._stop.wait(self.delay):
            return
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                n = self.run_pass()
                log.debug("L1 refresh pass: %d keys in %.3f s", n, time.monotonic() - start)
            except Exception:  # noqa: BLE001 - the next pass comes whatever this one hit
                log.exception("L1 refresh pass failed; the next one comes as usual")
            if self._stop.wait(self.interval):
                return

    def start(self) -> Refresher:
        """Start the thread (a no-op when disabled)."""
        if self.enabled and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="hps-l1-refresh", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Refresher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

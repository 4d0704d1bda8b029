"""A circuit breaker for a remote L2: after a failure, skip it for a back-off period.

Contract (docs/redis.md, "When Redis fails"):

- **Closed** (normal): every call goes to the backend. A call that fails with
  :class:`~hps.errors.BackendUnavailable` (unreachable, timed out, cluster down) *trips* the
  breaker: it opens for ``backoff_s``.
- **Open**: calls fail at once with :class:`~hps.errors.CircuitOpenError` (a
  ``BackendUnavailable``), without touching the network. A lookup therefore pays at most one
  socket timeout for a frozen Redis, on its first table; its later tables, and every request
  during the back-off, read L3 straight away.
- **Half-open**: once the back-off has passed, *one* call is let through as a probe (the
  others keep skipping). If it answers, the breaker closes and L2 is used again; if it fails,
  the breaker opens again for twice the previous back-off, up to ``max_backoff_s``.

Every other outcome of a call (success, or an error that proves the server answered, such as
a refused password) counts as "it answers". ``backoff_s == 0`` disables the breaker.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hps.errors import BackendUnavailable, CircuitOpenError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BreakerStats:
    """Counters of one breaker (cumulative since it was built)."""

    state: str  # "closed" | "open" | "half_open"
    trips: int  # closed or half-open -> open
    skipped: int  # calls refused while open
    recoveries: int  # half-open -> closed
    backoff_s: float  # the current (or next) back-off


class CircuitBreaker:
    """Thread-safe closed / open / half-open state machine; see the module docstring."""

    def __init__(
        self,
        name: str,
        backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backoff_s < 0 or max_backoff_s < backoff_s:
            raise ValueError(f"need 0 <= backoff_s <= max_backoff_s: {backoff_s}, {max_backoff_s}")
        self.name = name
        self.enabled = backoff_s > 0
        self._base = backoff_s
        self._max = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._backoff = backoff_s
        self._open_until: float | None = None  # None: closed
        self._probing = False
        self._last_error = ""
        self._trips = self._skipped = self._recoveries = 0

    @property
    def state(self) -> str:
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if self._open_until is None:
            return "closed"
        if self._probing or self._clock() >= self._open_until:
            return "half_open"
        return "open"

    def stats(self) -> BreakerStats:
        with self._lock:
            return BreakerStats(
                self._state(), self._trips, self._skipped, self._recoveries, self._backoff
            )

    @contextlib.contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Run the body unless the breaker is open; record how the backend behaved."""
        if not self.enabled:
            yield
            return
        probe = self._admit(where)
        try:
            yield
        except BackendUnavailable as exc:
            if not isinstance(exc, CircuitOpenError):
                self._failed(exc, probe)
            elif probe:
                self._release()
            raise
        except BaseException:
            self._answered(probe)
            raise
        else:
            self._answered(probe)

    def _admit(self, where: str) -> bool:
        """True when this call is the half-open probe; raises CircuitOpenError when open."""
        with self._lock:
            if self._open_until is None:
                return False
            now = self._clock()
            if now >= self._open_until and not self._probing:
                self._probing = True
                return True
            self._skipped += 1
            wait = max(0.0, self._open_until - now)
            when = "a probe is in flight" if self._probing else f"next try in {wait:.1f}s"
            raise CircuitOpenError(
                f"{where}: {self.name} skipped after a failure ({when}): {self._last_error}"
            )

    def _failed(self, exc: BaseException, probe: bool) -> None:
        with self._lock:
            now = self._clock()
            if self._open_until is None or probe:
                if self._open_until is not None:  # a failed probe: back off longer
                    self._backoff = min(self._max, self._backoff * 2)
                self._trips += 1
                self._open_until = now + self._backoff
                self._last_error = str(exc)
                log.warning("%s failed (%s); skipping it for %.1fs", self.name, exc, self._backoff)
            if probe:
                self._probing = False

    def _answered(self, probe: bool) -> None:
        if not probe:  # a call admitted before a trip proves nothing about now
            return
        with self._lock:
            self._recoveries += 1
            self._open_until = None
            self._backoff = self._base
            self._probing = False
        log.warning("%s answers again; using it again", self.name)

    def _release(self) -> None:
        with self._lock:
            self._probing = False

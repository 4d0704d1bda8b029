"""Warnings that a fault repeats on every request, logged once per interval instead."""

from __future__ import annotations

import logging
import math
import threading
import time

INTERVAL_S = 10.0
"""At most one line per subject this often; the occurrences held back are counted into it."""


class Throttled:
    """A logger's lines at ``level``, at most one per subject (a table, a kind of work) every
    ``interval_s`` seconds; the next line says how many were held back since."""

    def __init__(self, logger: logging.Logger, level: int, interval_s: float = INTERVAL_S):
        self._log = logger
        self._level = level
        self._interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}  # subject: (when logged, held since)
        self._lock = threading.Lock()

    def __call__(self, subject: str, msg: str, *args: object, count: int = 1) -> None:
        """Log ``msg % args`` unless a line of ``subject`` went out within the interval;
        ``count``: the occurrences this stands for (keys, requests)."""
        now = time.monotonic()
        with self._lock:
            when, held = self._last.get(subject, (-math.inf, 0))
            if now - when < self._interval_s:
                self._last[subject] = (when, held + count)
                return
            self._last[subject] = (now, 0)
        more = f" ({held} more since the last report)" if held else ""
        self._log.log(self._level, msg + more, *args)

"""A dependency-free progress bar on stderr (a line per 10% when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, *, enabled: bool = True) -> None:
        self.label, self.total, self.enabled = label, max(total, 1), enabled
        self.done = 0
        self._tty = sys.stderr.isatty()
        self._start = time.perf_counter()
        self._last_decile = -1

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        frac = min(self.done / self.total, 1.0)
        rate = self.done / max(time.perf_counter() - self._start, 1e-9)
        line = f"{self.label}: {self.done:,}/{self.total:,} rows {frac:6.1%} {rate:,.0f} rows/s"
        if self._tty:
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r[{bar:<30}] {line}")
            if self.done >= self.total:
                sys.stderr.write("\n")
        elif int(frac * 10) != self._last_decile:
            self._last_decile = int(frac * 10)
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

"""What ``hps serve`` shows of the request-size gate's error log when not ``--verbose``.

nginx writes a line per refused request (``client intended to send too large body``) and
per failed upstream connection: any client could fill the console with them. Without
``--verbose`` the gate logs to ``error.log`` in its folder, and :class:`GateLog` reads it
in a thread and reports, at most once per :data:`SUMMARY_S` seconds, one line with a count
per kind of entry. A kind is nginx's own words (:func:`kind`): what the client sent (the
request line, its address, the Host header, numbers) is cut off. Past
:data:`MAX_LOG_BYTES` the file is emptied once read (a flood then misses a few lines).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUMMARY_S = 60.0
MAX_LOG_BYTES = 16 * 2**20
MAX_KIND_CHARS = 120

# "2026/11/28 13:41:40 [error] 9010#9010: *7 client intended to send too large body: ..."
_ENTRY = re.compile(r"^\S+ \S+ \[\w+\] \d+#\d+: (?:\*\d+ )?(.*)$")


def kind(line: str) -> str | None:
    """The kind of an nginx error-log line, without what a client sent; None: no entry."""
    found = _ENTRY.match(line)
    if found is None:
        return None
    text = found.group(1).split(", client:")[0].split('"')[0]
    return re.sub(r"\d+", "N", text).rstrip(" ,:")[:MAX_KIND_CHARS]


@dataclass
class GateLog:
    """Counts the entries nginx appends to ``path`` and reports them to ``out``."""

    path: Path
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    interval: float = SUMMARY_S
    _counts: Counter[str] = field(default_factory=Counter, init=False)
    _offset: int = field(default=0, init=False)
    _partial: bytes = field(default=b"", init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hps-gate-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def read(self) -> None:
        """Count the entries appended since the last read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = self._partial + f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            if found := kind(line.decode(errors="replace")):
                self._counts[found] += 1
        if self._offset > MAX_LOG_BYTES:
            os.truncate(self.path, 0)  # nginx appends (O_APPEND): its next line starts at 0
            self._offset = 0

    def report(self) -> None:
        """One line of what was counted since the last report, if anything."""
        self.read()
        if not self._counts:
            return
        counts = "; ".join(f"{n} x {text}" for text, n in self._counts.most_common())
        self._counts.clear()
        print(
            f"request-size gate (nginx), last {self.interval:g}s: {counts} "
            "(hps serve --verbose shows each line)",
            file=self.out,
            flush=True,
        )

    def stop(self) -> None:
        """Stop the thread and report what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.report()

"""What ``hps serve`` shows of tritonserver's output, and of its models' logs.

Triton and its Python-backend stubs (our model.py processes, which log to the stderr they
inherit) write into one pipe; :class:`TritonOutput` reads it in a thread of ``hps serve``.
Every line passes :func:`hps.redact.scrub` before it is shown or kept.

- **verbose** (``hps serve --verbose``): every line is relayed to stderr as it comes, and
  Triton logs at its info level.
- **quiet** (the default): Triton runs with ``--log-info=false``. Until the server is ready
  nothing of Triton's own is shown (its start-up notices, e.g. CUDA/NVML ones on a machine
  without a GPU), only our models' warnings and errors; the last :data:`TAIL_LINES` lines
  other than information are kept, so that a failed start can show why
  (:meth:`TritonOutput.tail`). Each model's warm-up is told in one line once all its
  instances reported (:class:`hps.triton.instance_ready.InstanceReady`, logged by the model
  process, parsed here). Once the server is ready (:meth:`TritonOutput.ready`), warnings
  and errors (Triton's and our models') are relayed; information is not.

Either way the models Triton failed to load are noted (:attr:`TritonOutput.failed_loads`):
Triton 2.51 then counts such a model as live until it exits, so its shutdown waits out the
exit timeout and exits 1, which :meth:`hps.triton.supervisor.server.TritonServer.stop`
reports as that known cause (docs/security.md).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from hps.redact import scrub
from hps.triton.instance_ready import InstanceReady

log = logging.getLogger(__name__)

TAIL_LINES = 40
SUMMARY_WAIT_S = 10.0

# Triton: "I1124 23:55:54.613456 5108 file.cc:117] message" (I, W, E, F: the severity).
_TRITON = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ ")
# Our models (hps.triton.model.process's logging format): "WARNING hps.x: message".
_PYTHON = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: ")
_SIGNAL = re.compile(r"^Signal \((\d+)\) received")
_LEVELS = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "F"}
_FAILED_LOAD = re.compile(r"^E\d{4} [^\]]*\] \"failed to load '([^']+)'")
_INFO = re.compile(r"^(I\d{4} \d\d:\d\d:\d\d\.\d+ |(DEBUG|INFO) \S+: )")


def warm_up_summary(model: str, instances: list[InstanceReady]) -> str:
    """One line for a model whose instances are all warm."""
    n = len(instances)
    rows = sorted({i.l1_rows for i in instances})
    l1 = f"{rows[0]:,}" if len(rows) == 1 else f"{rows[0]:,}-{rows[-1]:,}"
    each = " each" if n > 1 else ""
    first = instances[0]
    l3 = "no L3" if first.l3 == "disabled" else f"L3 {first.l3} ({first.l3_mode})"
    l2 = "no L2" if first.l2 == "disabled" else f"L2 {first.l2}"
    tables = f"{first.tables} table{'s' if first.tables != 1 else ''}"
    return (
        f"{model}: warm in {max(i.seconds for i in instances):.1f}s, "
        f"{n} instance{'s' if n > 1 else ''}: L1 {l1} rows{each} ({tables}), {l2}, {l3}"
    )


@dataclass
class TritonOutput:
    """Reads a tritonserver's combined output and shows what the mode asks for (see above).

    ``instances``: the Triton models and their instance counts, to know when a model's
    warm-up is complete.
    """

    verbose: bool = False
    instances: dict[str, int] = field(default_factory=dict)
    out: IO[str] = field(default_factory=lambda: sys.stdout)  # summaries
    err: IO[str] = field(default_factory=lambda: sys.stderr)  # relayed lines
    _tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES), init=False)
    _warm: dict[str, list[InstanceReady]] = field(default_factory=dict, init=False)
    _told: set[str] = field(default_factory=set, init=False)
    _ready: bool = field(default=False, init=False)
    _lock: threading.Condition = field(default_factory=threading.Condition, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    failed_loads: list[str] = field(default_factory=list, init=False)  # Triton models
    _level: str = field(default="I", init=False)
    _triton: bool = field(default=True, init=False)
    _traceback: bool = field(default=False, init=False)

    def triton_args(self) -> list[str]:
        """tritonserver options for this mode."""
        return [] if self.verbose else ["--log-info=false"]

    def attach(self, proc: subprocess.Popen[bytes]) -> None:
        """Start relaying ``proc``'s stdout (a pipe carrying its stderr too)."""
        assert proc.stdout is not None, "tritonserver must be started with a pipe"
        stream = proc.stdout
        self._thread = threading.Thread(
            target=self._read, args=(stream,), name="hps-triton-output", daemon=True
        )
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        """Relay until tritonserver closes its end. A line that cannot be relayed (our
        stderr gone: a pipe whose reader died) is dropped: the pipe is drained whatever
        happens, or tritonserver would block on its next log line."""
        failed = False
        for raw in iter(stream.readline, b""):
            try:
                self.feed(raw.decode(errors="replace").rstrip("\r\n"))
            except Exception as exc:  # noqa: BLE001 - keep draining
                if not failed:
                    failed = True
                    log.warning("tritonserver's output is no longer relayed: %s", exc)
        stream.close()

    def feed(self, line: str) -> None:
        """Handle one line of output."""
        line = scrub(line)
        level = self._classify(line)
        with self._lock:
            if not _INFO.match(line):
                self._tail.append(line)
            if self.verbose or self._shown(level):
                print(line, file=self.err, flush=True)
            if not self._ready:
                self._note_warm(line)
            failed = _FAILED_LOAD.match(line)
            if failed and failed.group(1) not in self.failed_loads:
                self.failed_loads.append(failed.group(1))

    def _classify(self, line: str) -> str:
        """The severity of a line: its own, or that of the message it continues."""
        if found := _TRITON.match(line):
            self._level, self._triton, self._traceback = found.group(1), True, False
        elif found := _PYTHON.match(line):
            self._level, self._triton, self._traceback = _LEVELS[found.group(1)], False, False
        elif line.startswith("Traceback (most recent call last)"):
            self._level, self._triton, self._traceback = "E", False, True
        elif line.startswith("error: "):  # tritonserver's last words when it cannot start
            self._level, self._triton, self._traceback = "E", True, False
        elif found := _SIGNAL.match(line):  # a crash (11, 6), not our stop (15) or Ctrl-C (2)
            self._level = "I" if found.group(1) in ("2", "15") else "E"
            self._triton, self._traceback = True, False
        elif self._traceback and line and not line[0].isspace():
            self._traceback = False  # "ValueError: ...": the traceback's last line
        elif line and not line[0].isspace() and line[0] not in "+|":
            self._level, self._triton = "I", True  # no severity (e.g. "Signal (15) received.")
        return self._level  # else: a table row, an indented or a blank line: continuation

    def _shown(self, level: str) -> bool:
        if level == "I":
            return False
        # Before ready, Triton's own notices are start-up chatter (kept for tail()); ours not.
        return self._ready or not self._triton

    def _note_warm(self, line: str) -> None:
        report = InstanceReady.parse(line)
        if report is None or report.model in self._told:
            return
        reports = self._warm.setdefault(report.model, [])
        reports.append(report)
        if len(reports) >= self.instances.get(report.model, 1):
            self._told.add(report.model)
            print(warm_up_summary(report.model, reports), file=self.out, flush=True)
            self._lock.notify_all()

    def ready(self, timeout: float = SUMMARY_WAIT_S) -> None:
        """The server is ready: wait (up to ``timeout``) until every model's warm-up line is
        out, then relay warnings and errors from here on."""
        with self._lock:
            self._lock.wait_for(lambda: self._told >= set(self.instances), timeout)
            self._ready = True

    def tail(self) -> list[str]:
        """The last lines read but information (scrubbed): what to show when a start fails."""
        with self._lock:
            return list(self._tail)

    def close(self, timeout: float = 5.0) -> None:
        """Wait for the end of the output (the server and its stubs have exited)."""
        if self._thread is not None:
            self._thread.join(timeout)

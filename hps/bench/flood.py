"""A flood client: a process of its own that sends oversized requests to Triton as fast as
answers come, and the CPU a process tree has used (what ``hps bench gate`` and the gate's
tests measure a flood by).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# The flood: one client per protocol, each request of KEYS [1, n] (int64 zeros) and NUMKEYS
# [1, tables] = [n, 0, ...], sent as fast as answers come; one line per answer:
# "<protocol> <status>" (OK, or the status tritonclient reports, e.g. 413 or
# StatusCode.RESOURCE_EXHAUSTED, or the exception's type). "ready" once connected.
FLOOD = """
import sys
import numpy as np
from tritonclient.utils import InferenceServerException

grpc_url, http_url, model, tables, n = sys.argv[1:6]
clients = []
for protocol in sys.argv[6].split(","):
    if protocol == "grpc":
        import tritonclient.grpc as m
        client = m.InferenceServerClient(grpc_url)
    else:
        import tritonclient.http as m
        client = m.InferenceServerClient(http_url, connection_timeout=600, network_timeout=600)
    keys = m.InferInput("KEYS", [1, int(n)], "INT64")
    keys.set_data_from_numpy(np.zeros((1, int(n)), np.int64))
    counts = np.zeros((1, int(tables)), np.int32)
    counts[0, 0] = int(n)
    numkeys = m.InferInput("NUMKEYS", [1, int(tables)], "INT32")
    numkeys.set_data_from_numpy(counts)
    clients.append((protocol, client, [keys, numkeys]))
print("ready", flush=True)
while True:
    for protocol, client, inputs in clients:
        try:
            client.infer(model, inputs)
            status = "OK"
        except InferenceServerException as exc:
            status = str(exc.status())
        except Exception as exc:
            status = type(exc).__name__
        print(protocol, status, flush=True)
"""


@dataclass
class Flood:
    """A flood client process: oversized requests to ``model`` at ``grpc_url`` /
    ``http_url`` over ``protocols``; :attr:`answers` collects its lines as they come."""

    grpc_url: str
    http_url: str
    model: str
    tables: int
    keys: int
    protocols: tuple[str, ...] = ("grpc",)
    nice: int = 19
    answers: list[tuple[str, str]] = field(default_factory=list, init=False)
    proc: subprocess.Popen[str] | None = field(default=None, init=False)
    _ready: threading.Event = field(default_factory=threading.Event, init=False)
    _reader: threading.Thread | None = field(default=None, init=False)

    def start(self, timeout: float = 120.0) -> Flood:
        """Start it; return once it is connected and its first answer has come."""
        args = [self.grpc_url, self.http_url, self.model, str(self.tables), str(self.keys)]
        self.proc = subprocess.Popen(
            ["nice", "-n", str(self.nice), sys.executable, "-c", FLOOD, *args]
            + [",".join(self.protocols)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout  # a hang guard: it answers in seconds
        while not (self._ready.is_set() and self.answers):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the flood client exited with status {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the flood client sent nothing in {timeout:.0f}s")
            time.sleep(0.05)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                self._ready.set()
            elif len(parts := line.split(maxsplit=1)) == 2:  # not a line cut by stop()'s kill
                protocol, status = parts
                self.answers.append((protocol, status.strip()))

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()  # SIGKILL ends a stopped process too
            proc.wait()
        if self._reader is not None:
            self._reader.join(10)

    def statuses(self, since: int = 0) -> dict[str, int]:
        """``"<protocol> <status>"`` -> answers, from answer number ``since`` on."""
        return dict(Counter(f"{p} {s}" for p, s in self.answers[since:]))

    def __enter__(self) -> Flood:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def process_cpu_ms(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and its children so far, in ms."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [
        int(c) for t in Path(f"/proc/{pid}/task").glob("*/children") for c in t.read_text().split()
    ]
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a child that has just exited
            continue
        total += int(fields[11]) + int(fields[12])
    return total * 1e3 / tick

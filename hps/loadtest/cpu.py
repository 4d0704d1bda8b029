"""Where the machine's cores go during a load test: CPU time of every process by its role.

The processes ``hps loadtest`` starts (the broker, Redis, ``hps serve`` with tritonserver,
its Python-backend stubs and the gate, ``hps consume``, ``hps admin``, Locust) all descend
from it. A :func:`snapshot` reads each one's CPU seconds (user + system, ``/proc/<pid>/stat``)
and names its role from its command line; :func:`cores` turns two snapshots into cores per
role over the time between them (a process started in between counts from zero, one that
ended is missing from the later snapshot and its last interval is lost), plus ``other``:
the rest of the machine's busy time (``/proc/stat``), this process included.

Run read-only and with updates (``hps bench freshness``), the difference says which process
the update path takes the readers' cores with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hps.loadtest.resources import descendants

REPORT = "cpu.json"
"""The load test's report file of the cores per role after warm-up."""

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_HPS = {"serve": "hps serve", "consume": "hps consume", "admin": "hps admin"}


def role(args: list[str]) -> str:
    """A process's role from its command line (``/proc/<pid>/cmdline`` split at NULs)."""
    if not args:
        return "other"
    if args[0].startswith("nginx:"):  # retitled: "nginx: master process ... -e X/error.log"
        return "gate (nginx)"
    exe = Path(args[0]).name
    if exe == "triton_python_backend_stub" and len(args) > 1:
        parts = Path(args[1]).parts  # <repository>/<model>/<version>/model.py
        return f"stub {parts[-3]}" if len(parts) >= 3 else "stub"
    if exe == "tritonserver":
        return "tritonserver"
    if exe.startswith("nginx"):
        return "gate (nginx)"
    if exe.startswith("tansu"):
        return "broker (tansu)"
    if exe.startswith("redis-server"):
        return "redis"
    if "locust" in args[:3] or exe == "timeout":  # Locust runs under timeout(1)
        return "locust"
    if args[1:3] == ["-m", "hps.cli"] and len(args) > 3:
        return _HPS.get(args[3], f"hps {args[3]}")
    return exe


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (``None`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S
    except (OSError, IndexError, ValueError):
        return None


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy (not idle or waiting on I/O)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) * _TICK_S


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds of each process below a root, by pid, with its role, at ``t`` (monotonic)."""

    t: float
    machine_s: float
    processes: dict[int, tuple[str, float]] = field(default_factory=dict)


def snapshot(root: int, t: float) -> Snapshot:
    """Every process below ``root`` (not ``root`` itself), its role and CPU seconds."""
    procs: dict[int, tuple[str, float]] = {}
    for pid in descendants(root)[1:]:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # gone since the walk
        seconds = cpu_seconds(pid)
        if seconds is not None:
            procs[pid] = (role([a for a in args.split("\0") if a]), seconds)
    return Snapshot(t, machine_busy_seconds(), procs)


def cores(first: Snapshot, last: Snapshot) -> dict[str, float]:
    """Cores each role used from ``first`` to ``last``, largest first, and ``other``."""
    span = last.t - first.t
    if span <= 0:
        return {}
    used: dict[str, float] = {}
    for pid, (name, seconds) in last.processes.items():
        before = first.processes.get(pid)
        start = before[1] if before is not None and before[0] == name else 0.0
        used[name] = used.get(name, 0.0) + max(seconds - start, 0.0)
    out = {name: round(s / span, 3) for name, s in sorted(used.items(), key=lambda kv: -kv[1])}
    rest = (last.machine_s - first.machine_s - sum(used.values())) / span
    out["other"] = round(max(rest, 0.0), 3)
    return out


def format_cores(used: dict[str, float]) -> str:
    """``locust 0.72, stub demo_ctr 0.66, ...`` (roles under 0.01 core left out)."""
    return ", ".join(f"{name} {c:.2f}" for name, c in used.items() if c >= 0.01)

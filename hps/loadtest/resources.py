"""Memory of the serving processes during a load test (the soak's flat-memory check).

A :class:`ResourceSampler` thread samples, every ``interval_s``, the summed RSS of a process
and all its descendants (``hps serve`` -> ``tritonserver`` -> the Python backend stubs) and
the bytes in ``/dev/shm`` of the files they use (the stubs' shared-memory regions, named on
their command lines, and the ps.json's ``multi_process_hash_map`` segment), into
``resources.csv``. :meth:`growth_mb` is the growth after warm-up: the last sample minus the
first one taken after ``warmup_s`` (Triton's own memory-growth test allows < 100 MB);
:func:`check_growth_options` refuses a ``--max-growth-mb`` that could not be checked and
:func:`growth_failure` says why a run's check fails.
With ``cpu_root``, each sample also takes the CPU time of every process below it
(:mod:`hps.loadtest.cpu`); :meth:`cpu_cores` is the cores per role after warm-up.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hps.errors import ConfigError

if TYPE_CHECKING:
    from hps.loadtest.cpu import Snapshot

SHM = Path("/dev/shm")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def shm_names(pids: list[int]) -> set[str]:
    """Names under /dev/shm that appear on these processes' command lines."""
    names = set()
    for pid in pids:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        names |= {a.decode(errors="replace") for a in args if a and b"/" not in a}
    return {n for n in names if (SHM / n).is_file()}


class ResourceSampler:
    """Samples RSS and /dev/shm use of a process tree in a background thread."""

    def __init__(
        self,
        pid: int,
        out: Path,
        *,
        interval_s: float = 5.0,
        extra_shm: tuple[str, ...] = (),
        cpu_root: int | None = None,
    ) -> None:
        self.pid, self.out, self.interval_s = pid, out, interval_s
        self.extra_shm = set(extra_shm)
        self.cpu_root = cpu_root
        self.samples: list[tuple[float, int, int, int]] = []  # (t, processes, rss, shm)
        self.cpu: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hps-resources", daemon=True)
        self._start = time.monotonic()

    def sample(self) -> tuple[float, int, int, int]:
        pids = descendants(self.pid)
        rss = sum(rss_bytes(p) for p in pids)
        names = shm_names(pids) | {n for n in self.extra_shm if (SHM / n).is_file()}
        shm = sum((SHM / n).stat().st_blocks * 512 for n in names if (SHM / n).exists())
        t = time.monotonic() - self._start
        row = (round(t, 1), len(pids), rss, shm)
        self.samples.append(row)
        if self.cpu_root is not None:
            from hps.loadtest.cpu import snapshot

            self.cpu.append(snapshot(self.cpu_root, t))
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> ResourceSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval_s + 5)
        with open(self.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["seconds", "processes", "rss_bytes", "shm_bytes"])
            w.writerows(self.samples)

    def cpu_cores(self, warmup_s: float) -> dict[str, float] | None:
        """Cores per role (:func:`hps.loadtest.cpu.cores`) from the first sample after
        warm-up to the last."""
        from hps.loadtest.cpu import cores

        after = [s for s in self.cpu if s.t >= warmup_s]
        return cores(after[0], after[-1]) if len(after) >= 2 else None

    def growth_mb(self, warmup_s: float) -> tuple[float, float] | None:
        """(RSS, /dev/shm) growth in MB from the first sample after warm-up to the last."""
        after = [s for s in self.samples if s[0] >= warmup_s]
        if len(after) < 2:
            return None
        first, last = after[0], after[-1]
        return (last[2] - first[2]) / 2**20, (last[3] - first[3]) / 2**20


def check_growth_options(
    max_growth_mb: float | None, *, remote: bool, run_time_s: float, warmup_s: float,
    interval_s: float,
) -> None:  # fmt: skip
    """Refuse a ``--max-growth-mb`` that could not be checked: without a stack of this
    command's to sample, or with no room for two samples after the warm-up."""
    if max_growth_mb is None:
        return
    if remote:
        raise ConfigError(
            "--max-growth-mb samples the serving processes this command starts: not with "
            "--triton-grpc"
        )
    if warmup_s + 2 * interval_s > run_time_s:
        raise ConfigError(
            f"--max-growth-mb needs two memory samples after the warm-up: --warmup "
            f"{warmup_s:g} s + 2 x --sample-interval {interval_s:g} s exceed --run-time "
            f"{run_time_s:g} s"
        )


def growth_failure(growth: tuple[float, float] | None, max_growth_mb: float | None) -> str | None:
    """Why the memory check fails (None: it holds, or none was asked for)."""
    if max_growth_mb is None:
        return None
    if growth is None:
        return "--max-growth-mb: fewer than two memory samples after the warm-up, nothing checked"
    if max(growth) > max_growth_mb:
        return f"memory grew more than {max_growth_mb:g} MB after warm-up"
    return None

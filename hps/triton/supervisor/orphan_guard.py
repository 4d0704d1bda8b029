"""A guard that ends a server's process groups when the process that started them dies.

``prctl(PR_SET_PDEATHSIG)`` (:mod:`hps.triton.supervisor.lifecycle`) sends Triton and nginx
SIGTERM when ``hps serve`` dies, SIGKILL included. That starts Triton's graceful shutdown,
which waits for its models' stubs; a stub that never finalizes would keep Triton, and every
stub, running with nobody to stop them. The guard bounds that wait.

It is a small process of its own (this file run as a script, standard library only),
started before the servers. Its parent writes ``+<pgid>`` on its stdin for every process
group it starts. End of input means the parent is gone (the kernel closes the pipe
whatever killed it): the guard gives the groups :data:`GRACE_S` to exit on their own, then
SIGKILLs what is left of them, says so on stderr, and exits. A parent that stops its
servers itself stops the guard afterwards (:meth:`OrphanGuard.stop`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

GRACE_S = 15.0  # Triton's own exit takes 6-7 s (--exit-timeout-secs=5, then its models)
_POLL_S = 0.2

log = logging.getLogger(__name__)


def _alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs (zombies, ended but not yet reaped by
    init, do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc to tell: the group exists
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def guard(grace: float = GRACE_S) -> int:
    """The guard's run: read groups until end of input, then wait ``grace`` and kill."""
    groups: set[int] = set()
    for line in sys.stdin:
        if line.startswith("+") and line[1:].strip().isdigit():
            groups.add(int(line[1:]))
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(map(_alive, groups)):
        time.sleep(_POLL_S)
    left = sorted(g for g in groups if _alive(g))
    for pgid in left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    if left:
        with contextlib.suppress(OSError):  # no stderr left to say it on
            print(f"hps: process groups {left} outlived hps serve by {grace:g}s; killed them",
                  file=sys.stderr, flush=True)  # fmt: skip
    return 0


class OrphanGuard:
    """The parent's side: start the guard, name the groups it watches, stop it."""

    def __init__(self, grace: float = GRACE_S) -> None:
        self.grace = grace
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> OrphanGuard:
        # -I: no site, no environment, no current folder on the path: a bare interpreter.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(self.grace)],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C is for us, not for it
        )
        return self

    def watch(self, pgid: int) -> None:
        """Have the guard kill process group ``pgid`` should this process die."""
        if self.proc is None or self.proc.stdin is None:
            raise RuntimeError("the orphan guard is not started")
        try:
            self.proc.stdin.write(f"+{pgid}\n")
            self.proc.stdin.flush()
        except OSError:  # someone killed the guard: serve on, unguarded
            log.warning("the orphan guard %d is gone: process group %d is unguarded",
                        self.proc.pid, pgid)  # fmt: skip

    def stop(self) -> None:
        """End the guard without it touching anything (the groups were stopped in order)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # the guard is gone: nothing left to flush
                proc.stdin.close()


if __name__ == "__main__":
    sys.exit(guard(float(sys.argv[1]) if len(sys.argv) > 1 else GRACE_S))

"""One ``hps serve`` per state dir: the folder of its admin key (and of what it shares there).

A second ``hps serve`` on the same ps.json would write a new key over the first one's, and
``hps reload`` against the first would then fail. :func:`hold_state_dir` takes an exclusive
``flock`` on :data:`LOCK_FILE` in the state dir for as long as the server runs and writes
its PID into it; a second one is refused, naming that PID, before it touches anything.

Unlike the PID files that mark the temporary folders of a server
(:func:`hps.triton.supervisor.lifecycle.clean_stale`), the lock needs no check for a dead
holder: the kernel releases it when the holding process exits, SIGKILLed included.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hps.errors import ConfigError

LOCK_FILE = "hps-serve.lock"


@contextmanager
def hold_state_dir(state_dir: Path) -> Iterator[Path | None]:
    """Hold ``state_dir``'s lock while the block runs; the lock file (None: the folder
    cannot be written, the admin key then goes to a folder of this process alone)."""
    path = state_dir / LOCK_FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield None
        return
    with os.fdopen(fd, "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock.read().strip() or "?"
            raise ConfigError(
                f"another hps serve (pid {holder}) serves this ps.json ({path} is held); "
                "use --state-dir for a second one"
            ) from None
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield path

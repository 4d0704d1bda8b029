"""Temporary folders a process owns: marked with its PID, so that a successor can remove
those of a process that died without cleaning up, SIGKILLed
(:func:`hps.triton.supervisor.lifecycle.clean_stale`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

OWNER_FILE = "hps-owner.pid"
TEMP_PREFIXES = ("hps-triton-", "hps-repo-", "hps-rocks-secondary-", "hps-rocks-view-")
"""Prefixes of the owned folders, in the temporary directory (``TMPDIR``)."""


def owned_tempdir(prefix: str) -> Path:
    """A new temporary folder marked with this process's PID; ``prefix`` one of
    :data:`TEMP_PREFIXES`."""
    assert prefix in TEMP_PREFIXES, prefix
    path = Path(tempfile.mkdtemp(prefix=prefix))
    (path / OWNER_FILE).write_text(str(os.getpid()))
    return path


def owner(path: Path) -> int | None:
    """The PID that owns ``path`` (None: not an owned folder)."""
    try:
        return int((path / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        return None

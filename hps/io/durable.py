"""Small files replaced so that a crash leaves the old content or the new, never less."""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, sync it, rename it over ``path``
    and sync the folder (the rename itself is then durable)."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)

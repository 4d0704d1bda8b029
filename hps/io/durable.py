"""Files replaced so that a crash or a failure leaves the old content or the new, never less."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def replacing(*paths: Path) -> Iterator[list[BinaryIO]]:
    """Files to write the new content of ``paths`` into, in that order: temporaries beside
    them (``.<name>.<pid>.tmp``, hidden). When the block ends without an exception each is
    synced and renamed over its path, in order, and their folders are synced (the renames
    are then durable); on any exception (``KeyboardInterrupt`` too) they are removed and
    ``paths`` are left as they were. Several paths are renamed one after the other, not
    at once: only a crash between two renames leaves some paths new and the others old."""
    temps = [p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in paths]
    try:
        with ExitStack() as opened:
            files: list[BinaryIO] = [opened.enter_context(_open_beside(t, p))
                                     for t, p in zip(temps, paths, strict=True)]  # fmt: skip
            yield files
            for f in files:
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in zip(temps, paths, strict=True):
            tmp.replace(path)
    except BaseException:
        for t in temps:
            t.unlink(missing_ok=True)
        raise
    for folder in dict.fromkeys(p.parent for p in paths):
        _sync_folder(folder)


def _open_beside(temp: Path, path: Path) -> BinaryIO:
    """``temp`` opened for writing; an error names ``path``, the file asked for (the hidden
    temporary is ours)."""
    try:
        return open(temp, "wb")
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None


def replace_durably(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, sync it, rename it over ``path``
    and sync the folder (the rename itself is then durable)."""
    with replacing(path) as (f,):
        f.write(text.encode())


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

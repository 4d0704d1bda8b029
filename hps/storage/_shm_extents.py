"""The extents of a ``multi_process_hash_map`` segment: fixed-size blocks, a stack of free ids.

A table's buckets and row extents come from here and go back here. Memory is committed
(``posix_fallocate``) the first time an extent is handed out, so that a full ``/dev/shm``
shows as :class:`NoSpace` here rather than as a SIGBUS on first touch.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from hps.errors import BackendError
from hps.storage._shm_layout import HeaderWord, NoMemory, NoSpace


def commit(fd: int, path: str, offset: int, length: int) -> None:
    """Back these bytes of the file with memory now; raises :class:`NoMemory` when full."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise BackendError(f"multi_process_hash_map: {path}: {exc}") from exc
        raise NoMemory(f"{os.path.dirname(path)} is full") from exc


class Extents:
    """Views of the header's counters and the free-extent stack of one mapped segment."""

    def __init__(self, h: np.ndarray, free_stack: np.ndarray, fd: int, path: str) -> None:
        self.h, self.free_stack, self.fd, self.path = h, free_stack, fd, path
        self.n = int(h[HeaderWord.N_EXT])
        self.extent = int(h[HeaderWord.EXTENT])
        self.data_off = int(h[HeaderWord.DATA_OFF])

    def reset(self) -> None:
        """Every extent free."""
        self.free_stack[:] = np.arange(self.n - 1, -1, -1, dtype=np.int32)
        self.h[HeaderWord.FREE_TOP] = self.n

    def keep_only(self, held: np.ndarray) -> None:
        """Every extent free but ``held`` (a repair: what the surviving tables hold)."""
        free = np.setdiff1d(np.arange(self.n, dtype=np.int64), held)
        self.free_stack[: free.size] = free[::-1]
        self.h[HeaderWord.FREE_TOP] = free.size

    def alloc(self, n: int) -> np.ndarray:
        """Take ``n`` free extents (int64 ids); raises :class:`NoSpace`."""
        h = self.h
        top = int(h[HeaderWord.FREE_TOP])
        if n > top:
            raise NoSpace(f"{n} extents wanted, {top} free")
        ids = self.free_stack[top - n : top][::-1].astype(np.int64)
        if n and ids.max() >= h[HeaderWord.COMMITTED]:
            lo = int(h[HeaderWord.COMMITTED])
            start, length = self.offset(lo), (int(ids.max()) + 1 - lo) * self.extent
            commit(self.fd, self.path, int(start), length)
            h[HeaderWord.COMMITTED] = ids.max() + 1
        h[HeaderWord.FREE_TOP] = top - n
        return ids

    def free(self, ids: np.ndarray) -> None:
        top = int(self.h[HeaderWord.FREE_TOP])
        self.free_stack[top : top + ids.size] = ids
        self.h[HeaderWord.FREE_TOP] = top + ids.size

    @property
    def n_free(self) -> int:
        return int(self.h[HeaderWord.FREE_TOP])

    def offset(self, ext: np.ndarray | np.integer | int) -> np.ndarray:
        """Byte offset of extents ``ext`` (an array; 0-d for one extent)."""
        return self.data_off + np.asarray(ext, dtype=np.int64) * self.extent

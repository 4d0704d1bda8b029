"""The lock files of a ``multi_process_hash_map`` segment, and who may use them.

Three lock files sit next to the segment. ``<name>.lock`` is the readers-writer lock
(``flock`` LOCK_SH to read, LOCK_EX to write); the kernel drops it when a holder dies.
Once the segment is open, the main lock is taken on the segment file itself too, right
after ``.lock`` (:meth:`SegmentLocks.lock_segment`): a ``.lock`` removed while processes
hold it (an operator, a clean-up script) leaves those that open it afterwards on a new
``.lock`` while the others hold the old one, and only the segment's own lock then keeps
two writers out of one mapping. ``.lock`` is still needed to create a segment (there is
no file to lock yet) and to remove the files. The segment's lock is taken on a
description of the file of its own, never the one mapped: a mapping keeps its open file,
and with it the file's ``flock``, for as long as it exists, in a forked child too.
``<name>.users`` is held LOCK_SH by every attached store for its lifetime: whoever can turn
it into LOCK_EX on close is the last user (crashed processes do not count) and removes the
files when ``shared_memory_auto_remove`` is set.

``<name>.turn`` is a turnstile in front of the main lock: ``flock`` grants LOCK_SH while
readers hold it even to a writer's waiting LOCK_EX, so readers that keep overlapping would
starve writers for good. A writer holds the turnstile (LOCK_EX) while it waits for the main
lock; a reader passes through it (LOCK_SH, then unlock) before it takes the main lock, so
the readers that come after a waiting writer wait for it. It decides the order only, never
who may read or write (the main lock does): a turnstile file removed and made again while
stores hold the old one weakens the order until they reopen, nothing else, and is not
checked by :meth:`SegmentLocks.at_paths`. The kernel drops it too when a holder dies.

Plain files are used rather than ``multiprocessing.shared_memory`` so that no resource
tracker ever unlinks the segment.

A store belongs to the process that opened it: a forked child opens its own. A forked
child also closes its copies of the lock descriptors at once (:func:`_in_child`):
``flock`` locks belong to the open file, which a fork shares, so an idle child holding them
would keep its parent's write lock after the parent died, and count as a user for good.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Iterator

from hps.errors import BackendError


class SegmentLocks:
    """The lock files of the segment at ``path``, held open; one thread at a time inside."""

    def __init__(self, path: str) -> None:
        self.paths = (path, path + ".lock", path + ".users", path + ".turn")
        self.thread = threading.Lock()  # one thread of this process in the segment at a time
        self.pid = os.getpid()
        self.seg = -1  # the segment file's lock description (lock_segment), once open
        self.created: set[str] = set()  # the lock files this store made (remove_created)
        self.users = self._join()
        opened = [self.users]
        try:
            self.fd = self._open(self.paths[1])
            opened.append(self.fd)
            self.turn = self._open(self.paths[3])
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        self.closed = False
        _OPEN.add(self)

    def _open(self, path: str) -> int:
        """Open lock file ``path``, made if missing (then recorded in :attr:`created`)."""
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                with contextlib.suppress(FileNotFoundError):  # removed since: make it
                    return os.open(path, os.O_RDWR)
                continue
            self.created.add(path)
            return fd

    def _join(self) -> int:
        """Hold ``<name>.users`` LOCK_SH, on the file that is at the path right now."""
        users = self.paths[2]
        while True:
            fd = self._open(users)
            fcntl.flock(fd, fcntl.LOCK_SH)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(users).st_ino == os.fstat(fd).st_ino:
                    return fd
            os.close(fd)  # the last user removed it meanwhile: join the next one
            self.created.discard(users)

    def lock_segment(self, mapped: int) -> bool:
        """Take the segment's own lock exclusively, on a description of the file that
        ``mapped`` (the descriptor it is mapped through) has open; from here on the main
        lock includes it. Call with the main lock held exclusively, before reading the file.
        False if the path no longer names that file (removed meanwhile: open it again)."""
        try:
            fd = os.open(self.paths[0], os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            here, there = os.fstat(fd), os.fstat(mapped)
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                fcntl.flock(fd, fcntl.LOCK_EX)
                self.seg = fd
                return True
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return False

    def at_paths(self) -> bool:
        """Whether the lock files held are the ones at their paths (the last user of a
        segment removes them; a store that opened them just before must open the new ones)."""
        if self.closed:
            return False
        try:
            return all(
                os.stat(path).st_ino == os.fstat(fd).st_ino
                for path, fd in ((self.paths[1], self.fd), (self.paths[2], self.users))
            )
        except OSError:  # removed; or closed by another thread meanwhile (EBADF)
            return False

    def leave(self) -> None:
        """Stop counting as a user (``close``, under the main lock)."""
        fcntl.flock(self.users, fcntl.LOCK_UN)

    def only_user(self) -> bool:
        """True if no other store is attached. Call with the main lock held exclusively."""
        try:
            fcntl.flock(self.users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        # A failed conversion may have dropped our shared lock: take it again. Nobody holds
        # LOCK_EX meanwhile (that needs the main lock, which we hold).
        fcntl.flock(self.users, fcntl.LOCK_SH)
        return alone

    def shared(self) -> None:
        """Take the main lock shared, after passing the turnstile (a writer waiting for the
        main lock holds it: this reader then comes after that writer)."""
        fcntl.flock(self.turn, fcntl.LOCK_SH)
        fcntl.flock(self.turn, fcntl.LOCK_UN)
        self._lock(fcntl.LOCK_SH)

    def exclusive(self) -> None:
        """Take the main lock exclusively, holding the turnstile while waiting for it (no
        reader that comes meanwhile gets in first)."""
        fcntl.flock(self.turn, fcntl.LOCK_EX)
        try:
            self._lock(fcntl.LOCK_EX)
        finally:
            fcntl.flock(self.turn, fcntl.LOCK_UN)

    def _lock(self, op: int) -> None:
        """``.lock``, then the segment's own lock (always in this order: no deadlock)."""
        fcntl.flock(self.fd, op)
        if self.seg >= 0:
            try:
                fcntl.flock(self.seg, op)
            except BaseException:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                raise

    def unlock(self) -> None:
        """Let go of the main lock."""
        if self.seg >= 0:
            fcntl.flock(self.seg, fcntl.LOCK_UN)
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def held(self, op: int) -> Iterator[None]:
        """The main lock, ``fcntl.LOCK_SH`` or ``fcntl.LOCK_EX``, for the block."""
        if op == fcntl.LOCK_EX:
            self.exclusive()
        else:
            self.shared()
        try:
            yield
        finally:
            self.unlock()

    @property
    def forked(self) -> bool:
        """Whether this is a forked child of the process that opened the store."""
        return os.getpid() != self.pid

    def check_process(self) -> None:
        if self.forked:
            raise BackendError(
                f"multi_process_hash_map: this store was opened by process {self.pid}; "
                "open a new one in a forked child"
            )

    def remove_files(self) -> None:
        """Unlink the segment and its lock files, the turnstile's too (the last user,
        under the main lock)."""
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def remove_created(self) -> None:
        """Unlink the lock files this store made, unless another store holds them (an open
        that failed, under the main lock held exclusively): a refused open leaves nothing."""
        if self.created and self.only_user():
            for path in self.created:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _OPEN.discard(self)
            for fd in self._descriptors():
                os.close(fd)

    def _descriptors(self) -> list[int]:
        return [self.fd, self.users, self.turn] + ([self.seg] if self.seg >= 0 else [])


_OPEN: weakref.WeakSet[SegmentLocks] = weakref.WeakSet()


def _in_child() -> None:
    """After a fork, in the child: drop its copies of every store's lock descriptors (they
    are the parent's locks; closing them neither unlocks nor touches the parent's)."""
    for locks in list(_OPEN):
        for fd in locks._descriptors():  # the segment's lock description too
            with contextlib.suppress(OSError):
                os.close(fd)
        locks.closed = True
    _OPEN.clear()


os.register_at_fork(after_in_child=_in_child)

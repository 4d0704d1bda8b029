"""SharedHashMapStore closed, or failing to open: a closed store refuses every operation
and makes no files; a refused open leaves no lock files behind."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hps.errors import BackendError, ConfigError
from hps.storage import _shm_segment
from hps.storage._shm_layout import NoMemory
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.types import TableSpec

MiB = 1024 * 1024
SPEC = TableSpec("m", "t", 4)
KEYS = np.arange(10, dtype=np.int64)
CLOSED = "the store is closed"


def _open(tmp_path: Path, **kw: object) -> SharedHashMapStore:
    store = SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path), **kw)  # type: ignore[arg-type]
    store.open_table(SPEC)
    return store


def _ends(fn: Callable[[], object]) -> BaseException | None:
    """What ``fn`` raised (None: nothing), run in a thread: a hang guard of 10 s."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert raised, "still running: it never ends"
    return raised[0]


@pytest.mark.parametrize("check_s", [None, 0.0, 1.0])
def test_operations_after_close_are_refused_and_make_no_files(
    tmp_path: Path, check_s: float | None
) -> None:
    store = _open(tmp_path, identity_check_s=check_s)
    store.insert(SPEC.name, KEYS, np.ones((KEYS.size, 4), np.float32))
    store.close()
    assert os.listdir(tmp_path) == []  # the last user removed them
    operations: list[Callable[[], object]] = [
        lambda: store.fetch(SPEC.name, KEYS),
        lambda: store.insert(SPEC.name, KEYS, np.ones((KEYS.size, 4), np.float32)),
        lambda: store.remove(SPEC.name, KEYS),
        lambda: store.size(SPEC.name),
        lambda: store.stats(),
        lambda: store.open_table(SPEC),
        lambda: store.follow(),
    ]
    for op in operations:
        exc = _ends(op)
        assert isinstance(exc, BackendError) and CLOSED in str(exc), repr(exc)
    assert os.listdir(tmp_path) == []


def test_a_store_closed_while_another_is_attached_refuses_operations(tmp_path: Path) -> None:
    other, store = _open(tmp_path), _open(tmp_path, identity_check_s=0.0)
    store.close()
    exc = _ends(lambda: store.fetch(SPEC.name, KEYS))
    assert isinstance(exc, BackendError) and CLOSED in str(exc), repr(exc)
    assert other.stats()["attached"] == 1
    other.close()
    assert os.listdir(tmp_path) == []


def test_a_thread_racing_close_ends_with_the_error(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.insert(SPEC.name, KEYS, np.ones((KEYS.size, 4), np.float32))
    started = threading.Event()

    def loop() -> None:
        while True:
            store.fetch(SPEC.name, KEYS)
            started.set()

    raised: list[BaseException | None] = []
    thread = threading.Thread(target=lambda: raised.append(_ends(loop)), daemon=True)
    thread.start()
    assert started.wait(10)
    store.close()
    thread.join(15)  # a hang guard: _ends gives up after 10 s
    assert raised and isinstance(raised[0], BackendError), raised
    assert CLOSED in str(raised[0])
    assert os.listdir(tmp_path) == []


def test_a_refused_open_leaves_no_lock_files(tmp_path: Path) -> None:
    junk = tmp_path / "seg"
    junk.write_bytes(b"hello junk")
    with pytest.raises(BackendError, match="remove it"):
        SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path))
    assert os.listdir(tmp_path) == ["seg"]
    assert junk.read_bytes() == b"hello junk"


def test_a_segment_that_cannot_be_made_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: object) -> None:
        raise NoMemory(f"{tmp_path} is full")

    monkeypatch.setattr(_shm_segment, "commit", full)
    with pytest.raises(BackendError, match="is full"):
        SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_refused_open_leaves_the_lock_files_of_attached_stores(tmp_path: Path) -> None:
    kept = _open(tmp_path, deployment="/a")
    with pytest.raises(ConfigError):
        SharedHashMapStore("seg", 8 * MiB, directory=str(tmp_path), deployment="/b")
    assert sorted(os.listdir(tmp_path)) == ["seg", "seg.lock", "seg.turn", "seg.users"]
    assert kept.fetch(SPEC.name, KEYS)[1].size == KEYS.size
    kept.close()
    assert os.listdir(tmp_path) == []


def _mapped(path: Path) -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line for line in maps if str(path) in line]


def test_close_unmaps_the_segment_while_the_store_object_lives(tmp_path: Path) -> None:
    """The table handles are views into the mapping: closed with them gone, the mapping
    (up to shared_memory_size, its files already removed) must not wait for the store."""
    store = _open(tmp_path)
    store.insert(SPEC.name, KEYS, np.ones((KEYS.size, 4), np.float32))
    path = tmp_path / "seg"
    assert _mapped(path)
    store.close()
    assert _mapped(path) == []
    assert os.listdir(tmp_path) == []


def test_a_forked_child_closes_or_uses_a_store_whose_lock_a_parent_thread_held(
    tmp_path: Path,
) -> None:
    """A fork copies the store's thread lock as it was: held by a parent thread (in
    open_table, follow) it would never be released in the child."""
    store = _open(tmp_path)
    with store._structure:  # as a parent thread inside open_table at the fork
        pid = os.fork()
        if pid == 0:  # the child: must end, not hang (the alarm kills a hang)
            import signal

            signal.alarm(10)
            code = 0
            try:
                store.open_table(TableSpec("m", "u", 4))
                code = 1
            except BackendError as exc:
                code = 0 if "opened by process" in str(exc) else 2
            store.close()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    store.insert(SPEC.name, KEYS, np.ones((KEYS.size, 4), np.float32))  # the parent goes on
    store.close()

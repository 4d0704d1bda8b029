"""Reads shared by reports: one per interval and key, one for concurrent callers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

import pytest

from hps.service.recent import Recent

K = TypeVar("K", bound=Hashable)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_reused_until_it_is_max_age_old() -> None:
    clock = Clock()
    recent: Recent[str, int] = Recent(1.0, clock)
    answers = iter(range(10))

    def read(key: str) -> int:
        return next(answers)

    assert recent.get("a", read) == 0
    clock.now += 0.99
    assert recent.get("a", read) == 0
    clock.now += 0.01
    assert recent.get("a", read) == 1
    assert recent.reads == 2


def test_another_key_reads_again() -> None:
    recent: Recent[frozenset[str], str] = Recent(60.0, Clock())
    assert recent.get(frozenset({"t1"}), lambda k: ",".join(sorted(k))) == "t1"
    assert recent.get(frozenset({"t1", "t2"}), lambda k: ",".join(sorted(k))) == "t1,t2"
    assert recent.get(frozenset({"t1", "t2"}), lambda k: "not read") == "t1,t2"
    assert recent.reads == 2


def test_a_failed_read_is_kept_as_a_back_off_for_max_age() -> None:
    """Within max age of a failure its callers get the same error without a new read (a
    down source is asked about once per max age); then the next caller reads again."""
    clock = Clock()
    recent: Recent[None, int] = Recent(1.0, clock)
    fails = 0

    def fail(_: None) -> int:
        nonlocal fails
        fails += 1
        raise OSError(f"refused {fails}")

    with pytest.raises(OSError, match="refused 1"):
        recent.get(None, fail)
    clock.now += 0.99
    with pytest.raises(OSError, match="refused 1"):
        recent.get(None, lambda _: 7)
    assert recent.reads == 1 and fails == 1
    clock.now += 0.01
    assert recent.get(None, lambda _: 7) == 7
    assert recent.get(None, fail) == 7
    assert recent.reads == 2 and fails == 1


def test_an_answer_is_aged_from_when_its_read_ended() -> None:
    clock = Clock()
    recent: Recent[None, int] = Recent(1.0, clock)

    def slow(_: None) -> int:
        clock.now += 5.0  # a read five times longer than the max age
        return 42

    assert recent.get(None, slow) == 42
    clock.now += 0.99
    assert recent.get(None, lambda _: 0) == 42
    clock.now += 0.01
    assert recent.get(None, lambda _: 0) == 0
    assert recent.reads == 2


def gets(recent: Recent[K, int], key: K, read: Callable[[K], int], n: int) -> Callers:
    """``n`` threads asking ``recent`` for ``key`` at once, started."""
    callers = Callers()
    for _ in range(n):
        callers.start(lambda: recent.get(key, read))
    return callers


class Callers:
    """Threads calling ``get`` and what each got: its answer or its exception."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.got: list[object] = []
        self._lock = threading.Lock()

    def start(self, call: Callable[[], int]) -> None:
        def run() -> None:
            try:
                answer: object = call()
            except Exception as exc:
                answer = exc
            with self._lock:
                self.got.append(answer)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> list[object]:
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive()
        return self.got


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_callers_during_a_slow_read_make_one_read() -> None:
    """Twenty callers asking during a 0.3 s read: one read, every caller its answer."""
    recent: Recent[None, int] = Recent(1.0)

    def slow(_: None) -> int:
        time.sleep(0.3)
        return 42

    callers = gets(recent, None, slow, 20)
    assert callers.join() == [42] * 20 and recent.reads == 1


def test_a_read_slower_than_max_age_is_shared_by_its_waiters() -> None:
    """Callers that waited for a read take its answer even when it took longer than the max
    age: none reads again (the defect: each read again, one after another)."""
    recent: Recent[None, int] = Recent(0.05)
    started, release = threading.Event(), threading.Event()
    reads = iter(range(10))

    def slow(_: None) -> int:
        started.set()
        release.wait(10)
        time.sleep(0.3)  # six times the max age
        return next(reads)

    first = gets(recent, None, slow, 1)
    assert started.wait(10)
    others = gets(recent, None, slow, 8)
    until(lambda: recent.waiting == 8)
    release.set()
    assert first.join() + others.join() == [0] * 9 and recent.reads == 1


def test_callers_waiting_for_a_failed_read_all_get_its_error() -> None:
    recent: Recent[None, int] = Recent(60.0)
    started, release = threading.Event(), threading.Event()

    def fail(_: None) -> int:
        started.set()
        release.wait(10)
        raise OSError("refused")

    first = gets(recent, None, fail, 1)
    assert started.wait(10)
    others = gets(recent, None, fail, 5)
    until(lambda: recent.waiting == 5)
    release.set()
    got = first.join() + others.join()
    assert len(got) == 6 and recent.reads == 1
    assert all(isinstance(e, OSError) and str(e) == "refused" for e in got)


def test_a_failing_source_is_read_once_per_max_age_under_load() -> None:
    """A source that takes 0.3 s to fail, asked for continuously by four callers for 1 s:
    about one read per (read time + max age), not one per caller."""
    recent: Recent[None, int] = Recent(0.2)

    def fail(_: None) -> int:
        time.sleep(0.3)
        raise OSError("refused")

    def ask() -> int:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                recent.get(None, fail)
        return 0

    callers = Callers()
    for _ in range(4):
        callers.start(ask)
    assert callers.join() == [0] * 4
    assert 1 <= recent.reads <= 3  # 1.3 s at most of 0.5 s cycles; four per cycle before


def test_a_caller_for_another_key_waits_then_reads_its_own() -> None:
    recent: Recent[str, str] = Recent(60.0)
    started, release = threading.Event(), threading.Event()

    def slow(key: str) -> str:
        if key == "a":
            started.set()
            release.wait(10)
        return key

    first = Callers()
    first.start(lambda: len(recent.get("a", slow)))
    assert started.wait(10)
    other = Callers()
    other.start(lambda: len(recent.get("bb", slow)))
    until(lambda: recent.waiting == 1)
    assert recent.reads == 0  # one read at a time
    release.set()
    assert first.join() == [1] and other.join() == [2] and recent.reads == 2


class Interrupt(BaseException):
    pass


def test_an_interrupted_read_is_not_kept_and_its_waiters_read_again() -> None:
    recent: Recent[None, int] = Recent(60.0)
    started, release = threading.Event(), threading.Event()

    def interrupted(_: None) -> int:
        started.set()
        release.wait(10)
        raise Interrupt

    def first_caller() -> None:
        with contextlib.suppress(Interrupt):
            recent.get(None, interrupted)

    first = threading.Thread(target=first_caller)
    first.start()
    assert started.wait(10)
    waiter = gets(recent, None, lambda _: 7, 1)
    until(lambda: recent.waiting == 1)
    release.set()
    first.join(10)
    assert waiter.join() == [7] and recent.reads == 2
    assert recent.get(None, interrupted) == 7


def test_concurrent_callers_share_one_read() -> None:
    recent: Recent[None, int] = Recent(60.0)
    started, release = threading.Event(), threading.Event()

    def slow(_: None) -> int:
        started.set()
        release.wait(10)
        return 42

    got: list[int] = []
    first = threading.Thread(target=lambda: got.append(recent.get(None, slow)))
    first.start()
    assert started.wait(10)
    others = [threading.Thread(target=lambda: got.append(recent.get(None, slow))) for _ in range(4)]
    for t in others:
        t.start()
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert got == [42] * 5 and recent.reads == 1

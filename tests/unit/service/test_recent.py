"""Reads shared by reports: one per interval and key, one for concurrent callers."""

from __future__ import annotations

import threading

import pytest

from hps.service.recent import Recent


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


def test_a_failed_read_is_not_kept() -> None:
    recent: Recent[None, int] = Recent(60.0, Clock())

    def fail(_: None) -> int:
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        recent.get(None, fail)
    assert recent.get(None, lambda _: 7) == 7
    assert recent.get(None, fail) == 7


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

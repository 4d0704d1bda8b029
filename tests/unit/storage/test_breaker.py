"""The L2 circuit breaker's state machine, on a fake clock (hps.storage.breaker)."""

from __future__ import annotations

import threading

import pytest

from hps.errors import BackendError, BackendUnavailable, CircuitOpenError
from hps.storage.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fail(breaker: CircuitBreaker, exc: Exception | None = None) -> None:
    with pytest.raises(BackendUnavailable), breaker.guard("op"):
        raise exc or BackendUnavailable("timed out")


def ok(breaker: CircuitBreaker) -> None:
    with breaker.guard("op"):
        pass


def test_a_failure_opens_it_and_calls_skip_without_running() -> None:
    clock = Clock()
    b = CircuitBreaker("L2", 1.0, 8.0, clock=clock)
    ok(b)
    assert b.state == "closed"
    fail(b)
    assert b.state == "open"
    ran = []
    with pytest.raises(CircuitOpenError, match="next try in 1.0s.*timed out"), b.guard("fetch t"):
        ran.append(1)
    assert ran == []
    assert b.stats().skipped == 1 and b.stats().trips == 1


def test_one_probe_after_the_backoff_closes_it_when_it_answers() -> None:
    clock = Clock()
    b = CircuitBreaker("L2", 1.0, 8.0, clock=clock)
    fail(b)
    clock.now += 1.0
    assert b.state == "half_open"
    with b.guard("probe"):  # while the probe runs, everybody else still skips
        other = b.guard("other")
        with pytest.raises(CircuitOpenError, match="a probe is in flight"), other:
            pass
    assert b.state == "closed"
    ok(b)
    s = b.stats()
    assert (s.trips, s.recoveries, s.backoff_s) == (1, 1, 1.0)


def test_failed_probes_double_the_backoff_up_to_the_maximum() -> None:
    clock = Clock()
    b = CircuitBreaker("L2", 1.0, 3.0, clock=clock)
    fail(b)
    waits = []
    for _ in range(4):
        clock.now += b.stats().backoff_s
        fail(b)  # the probe fails
        waits.append(b.stats().backoff_s)
    assert waits == [2.0, 3.0, 3.0, 3.0]
    clock.now += 2.9
    with pytest.raises(CircuitOpenError), b.guard("op"):
        pass
    clock.now += 0.1
    ok(b)
    assert b.state == "closed" and b.stats().backoff_s == 1.0


def test_an_error_that_proves_the_server_answered_closes_a_probe() -> None:
    clock = Clock()
    b = CircuitBreaker("L2", 1.0, 8.0, clock=clock)
    fail(b)
    clock.now += 1.0
    with pytest.raises(BackendError), b.guard("probe"):
        raise BackendError("WRONGPASS")
    assert b.state == "closed"
    # such errors never trip it either
    with pytest.raises(BackendError), b.guard("op"):
        raise BackendError("WRONGPASS")
    assert b.state == "closed"


def test_late_failures_of_calls_admitted_before_the_trip_do_not_extend_it() -> None:
    clock = Clock()
    b = CircuitBreaker("L2", 1.0, 8.0, clock=clock)
    fail(b)
    clock.now += 0.5
    b._failed(BackendUnavailable("late"), probe=False)  # an in-flight call times out later
    clock.now += 0.5
    assert b.state == "half_open"
    assert b.stats().trips == 1


def test_zero_backoff_disables_it() -> None:
    b = CircuitBreaker("L2", 0.0, 0.0)
    for _ in range(3):
        fail(b)
    ok(b)
    assert b.stats().skipped == 0 and b.state == "closed"


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker("L2", 2.0, 1.0)


def test_concurrent_callers_let_exactly_one_probe_through() -> None:
    clock = Clock()
    b = CircuitBreaker("L2", 1.0, 8.0, clock=clock)
    fail(b)
    clock.now += 1.0
    gate, admitted, skipped = threading.Event(), [], []

    def call() -> None:
        try:
            with b.guard("op"):
                admitted.append(1)
                gate.wait(5)
        except CircuitOpenError:
            skipped.append(1)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    while len(admitted) + len(skipped) < 8:
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join()
    assert (len(admitted), len(skipped)) == (1, 7)
    assert b.state == "closed"


def test_config_keys_and_their_bounds() -> None:
    from hps.config import parse_config
    from hps.errors import ConfigError

    model = {"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4]}
    vdb = {"type": "redis", "hps_breaker_backoff_s": 0.5, "hps_breaker_max_backoff_s": 2.0}
    cfg = parse_config({"models": [model], "volatile_db": vdb}, "ps.json")
    assert (cfg.volatile_db.hps_breaker_backoff_s, cfg.volatile_db.hps_breaker_max_backoff_s) == (
        0.5,
        2.0,
    )
    vdb["hps_breaker_max_backoff_s"] = 0.1
    with pytest.raises(ConfigError, match="hps_breaker_max_backoff_s must be >="):
        parse_config({"models": [model], "volatile_db": vdb}, "ps.json")

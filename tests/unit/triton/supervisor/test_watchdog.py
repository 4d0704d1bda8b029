"""The watchdog's decision: reload a model whose stub is dead or stuck, never one that is
only overloaded (its probes wait in the same queue as the traffic, and may be refused by it,
while its instances keep executing)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hps.errors import BackendUnavailable, RequestError
from hps.triton.supervisor import watchdog
from hps.triton.supervisor.watchdog import Recovery, Stall, Watchdog

WINDOW = 30.0  # the default: 3 probes of 10 s


def test_probes_timing_out_on_a_model_that_executes_nothing_reload_it() -> None:
    """Three probes that each waited their 10 s, the model's count standing still: stuck,
    when the third fails (as the former rule, 3 timeouts in a row, had it)."""
    stall = Stall(WINDOW, 3)
    assert not stall.failed(0.0, 10.0, 5)
    assert not stall.failed(10.5, 20.5, 5)
    assert stall.failed(21.0, 31.0, 5)


def test_an_overloaded_model_that_keeps_executing_is_left_to_serve() -> None:
    stall = Stall(WINDOW, 3)
    for i in range(100):  # 10 minutes of timed-out probes, the model executing meanwhile
        assert not stall.failed(i * 12.0, i * 12.0 + 10.0, 1000 + 37 * i)


def test_probes_refused_at_once_need_the_whole_window_without_execution() -> None:
    """A full queue refuses a probe at once: a stuck model is only called so once nothing
    executed for the whole window, not after 3 quick refusals."""
    stall = Stall(WINDOW, 3)
    results = [stall.failed(t, t + 0.01, 7) for t in np.arange(0.0, 40.0, 2.0)]
    assert results.index(True) == 15  # the probe sent at 30 s
    assert all(results[15:])


def test_progress_or_a_reset_count_starts_the_window_afresh() -> None:
    stall = Stall(WINDOW, 3)
    assert not stall.failed(0.0, 10.0, 5)
    assert not stall.failed(20.0, 29.0, 5)
    assert not stall.failed(29.0, 39.0, 6)  # one execution: a window from 29 s
    assert not stall.failed(40.0, 50.0, 6)
    assert stall.failed(52.0, 62.0, 6)
    assert not stall.failed(70.0, 80.0, 0)  # the count went back (reloaded): afresh
    stall.answered()
    assert not stall.failed(100.0, 110.0, 0)


def test_a_stall_takes_as_many_failed_probes_as_before() -> None:
    """Probes far apart (``--watchdog-interval 60``): 3 failures in a row still, as the
    former rule had it, not the window alone."""
    stall = Stall(WINDOW, 3)
    assert not stall.failed(0.0, 10.0, 5)
    assert not stall.failed(70.0, 80.0, 5)
    assert stall.failed(140.0, 150.0, 5)


def test_a_count_triton_does_not_give_shows_no_progress() -> None:
    stall = Stall(WINDOW, 3)
    assert not stall.failed(0.0, 10.0, None)
    assert not stall.failed(12.0, 22.0, 3)  # the first count seen: nothing to compare with
    assert stall.failed(24.0, 34.0, None)


class FakeTriton:
    """A Client's surface the watchdog uses: ``infer`` and the statistics API."""

    def __init__(self) -> None:
        self.error: Exception | None = BackendUnavailable("[503] Request timeout expired")
        self.count: int | None = 10
        self.client = self

    def infer(self, model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if self.error is not None:
            raise self.error
        return np.zeros((1, 4), np.float32)

    def get_inference_statistics(self, model: str) -> dict[str, Any]:
        if self.count is None:
            raise InferenceServerException("statistics unavailable")
        return {"model_stats": [{"name": model, "version": "1", "execution_count": self.count}]}


@pytest.fixture
def dog(monkeypatch: pytest.MonkeyPatch) -> tuple[Watchdog, list[str], list[float]]:
    """A watchdog whose reloads are recorded, on a clock the test moves."""
    clock = [0.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
    dog = Watchdog("127.0.0.1:1", "key", {"m": {}})
    reasons: list[str] = []

    def reload(model: str, reason: str) -> Recovery:
        reasons.append(reason)
        dog._stalls[model].answered()
        return Recovery(model, reason, 0.0)

    monkeypatch.setattr(dog, "reload", reload)
    return dog, reasons, clock


def probe(dog: Watchdog, triton: FakeTriton, clock: list[float], step: float) -> bool:
    clock[0] += step
    return dog.check(triton, "m") is not None  # type: ignore[arg-type]


def test_check_reloads_a_stuck_model_only(dog) -> None:
    wd, reasons, clock = dog
    triton = FakeTriton()
    for _ in range(20):  # refused by its queue for 40 s, executing all along: overloaded
        triton.count = (triton.count or 0) + 3
        assert not probe(wd, triton, clock, 2.0)
    triton.error = None
    assert not probe(wd, triton, clock, 2.0)
    triton.error = BackendUnavailable("[503] Exceeds maximum queue size")
    stuck = [probe(wd, triton, clock, 2.0) for _ in range(16)]  # count standing still
    assert stuck == [False] * 15 + [True]
    assert len(reasons) == 1 and "nothing executed" in reasons[0]
    assert "Exceeds maximum queue size" in reasons[0]


def test_check_reloads_a_dead_stub_at_once_and_leaves_other_errors(dog) -> None:
    wd, reasons, clock = dog
    triton = FakeTriton()
    triton.error = RequestError("Request for unknown model: 'm' is not found")
    assert not probe(wd, triton, clock, 2.0)
    triton.error = BackendUnavailable("Stub process 'm_0_0' is not healthy.")
    assert probe(wd, triton, clock, 2.0)
    assert reasons == ["Stub process 'm_0_0' is not healthy."]


def test_executions_sums_the_versions_and_is_none_when_triton_does_not_say() -> None:
    triton = FakeTriton()
    stats = {"model_stats": [{"execution_count": 4}, {"execution_count": "3"}]}
    triton.get_inference_statistics = lambda model: stats  # type: ignore[method-assign]
    assert watchdog.executions(triton, "m") == 7  # type: ignore[arg-type]
    triton = FakeTriton()
    triton.count = None
    assert watchdog.executions(triton, "m") is None  # type: ignore[arg-type]

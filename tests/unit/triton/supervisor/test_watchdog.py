"""The watchdog's decision: reload a model whose stub is dead or stuck, never one that is
only overloaded (its probes wait in the same queue as the traffic, and may be refused by it,
while its instances keep executing)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hps.config import ModelConfig
from hps.errors import BackendUnavailable, RequestError
from hps.triton.supervisor import watchdog
from hps.triton.supervisor.watchdog import Recovery, Stall, Watchdog, watched
from tests.helpers import make_config

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


class Stubs:
    """Triton's stub processes as the watchdog sees them (PID -> version, per model), and
    the versions' states in its repository index."""

    def __init__(self, stubs: dict[int, str], states: dict[int, str] | None = None) -> None:
        self.stubs = {"m": stubs}
        self.states = states if states is not None else {1: "READY"}

    def pids(self, server_pid: int) -> dict[str, dict[int, str]]:
        return {m: dict(pids) for m, pids in self.stubs.items() if pids}

    def version_states(self, model: str) -> dict[int, str]:
        return dict(self.states)


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> tuple[Watchdog, Stubs, list[str]]:
    """A watchdog of model ``m`` with 2 instances, its stubs and states faked; reloading
    it (recorded) starts 2 new stubs."""
    stubs = Stubs({101: "1", 102: "1"})
    monkeypatch.setattr(watchdog, "stub_pids", stubs.pids)
    dog = Watchdog("127.0.0.1:1", "key", {"m": {}}, server_pid=1, instances={"m": 2})
    monkeypatch.setattr(dog.control, "version_states", stubs.version_states)
    reasons: list[str] = []

    def reload(model: str, reason: str) -> Recovery:
        reasons.append(reason)
        stubs.stubs["m"] = {pid + 100: v for pid, v in stubs.stubs["m"].items()} | {203: "1"}
        return Recovery(model, reason, 0.0)

    monkeypatch.setattr(dog, "reload", reload)
    return dog, stubs, reasons


def test_a_killed_stub_of_two_instances_reloads_the_model_though_probes_succeed(
    stubbed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton routes a probe to any instance: after one of two stubs died, probes land on
    the healthy one and succeed. The stub's disappearance alone reloads the model, at once
    (the next look at the stubs), not after a probe happens to reach the dead instance."""
    dog, stubs, reasons = stubbed
    triton = FakeTriton()
    triton.error = None  # every probe answered: the healthy instance took it
    probed: list[str] = []

    class Connect:
        def __init__(self, url: str, network_timeout: float) -> None: ...
        def __enter__(self) -> FakeTriton:
            return triton

        def __exit__(self, *exc: object) -> None: ...

    def infer(model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
        probed.append(model)
        return np.zeros((1, 4), np.float32)

    triton.infer = infer  # type: ignore[method-assign]
    monkeypatch.setattr(watchdog, "Client", Connect)
    monkeypatch.setattr(watchdog, "STUB_POLL_S", 0.01)
    dog.interval = 3600.0  # no periodic probe: only the disappearance can tell
    dog.start()
    try:
        time.sleep(0.05)
        del stubs.stubs["m"][101]  # kill -9 of one stub; Triton still calls the model READY
        deadline = time.monotonic() + 5.0
        while not reasons and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # the new stubs: no further reload
    finally:
        dog.stop()
    assert reasons == ["a stub process disappeared"]


def test_stubs_replaced_by_a_reload_or_gone_with_an_unload_are_no_death(stubbed) -> None:
    dog, stubs, reasons = stubbed
    triton = FakeTriton()
    triton.error = None
    known = dog.round(triton, stubs.pids(1), due=False)
    stubs.stubs["m"] |= {301: "1"}  # a reload (hps reload, the control plane): new stubs
    known = dog.round(triton, known, due=False)
    stubs.stubs["m"] |= {302: "1"}
    known = dog.round(triton, known, due=False)
    del stubs.stubs["m"][101]  # then the old ones go, one look apart
    known = dog.round(triton, known, due=False)
    del stubs.stubs["m"][102]
    known = dog.round(triton, known, due=False)
    assert reasons == [] and known == {"m": {301: "1", 302: "1"}}
    stubs.states = {1: "UNLOADING"}  # an operator's unload: the stubs go one by one
    del stubs.stubs["m"][301]
    known = dog.round(triton, known, due=False)
    stubs.states = {}  # unloaded long ago: absent from the index
    del stubs.stubs["m"][302]
    known = dog.round(triton, known, due=False)
    assert reasons == [] and known == {}
    stubs.stubs["m"] = {401: "2", 402: "2"}  # version 2 loads, then version 1 retires
    stubs.states = {2: "READY"}
    known = dog.round(triton, {"m": {101: "1", 102: "1"}}, due=False)
    assert reasons == []


def test_a_dead_stub_is_reloaded_once_and_again_when_the_reload_failed(stubbed) -> None:
    dog, stubs, reasons = stubbed
    triton = FakeTriton()
    triton.error = None
    del stubs.stubs["m"][102]
    known = dog.round(triton, {"m": {101: "1", 102: "1"}}, due=False)
    assert reasons == ["a stub process disappeared"]
    assert known == {"m": {201: "1", 203: "1"}}, "the reload's own stubs are known at once"
    # the old healthy stub going only after our reload (Triton kept the old version)
    known = dog.round(triton, {"m": {101: "1", 201: "1", 203: "1"}}, due=True)
    assert len(reasons) == 1, "a stub replaced by our own reload is no death"
    # a reload Triton refused: the model stays suspect, reloaded again at the next round
    dog.reload = lambda model, reason: reasons.append(reason)
    del stubs.stubs["m"][203]
    known = dog.round(triton, known, due=False)
    known = dog.round(triton, known, due=False)
    known = dog.round(triton, known, due=True)
    assert len(reasons) == 3


def test_a_single_instance_stub_killed_is_reloaded_without_a_probe(stubbed) -> None:
    dog, stubs, reasons = stubbed
    dog.instances = {}  # not named: one instance
    stubs.stubs["m"] = {}
    dog.round(FakeTriton(), {"m": {101: "1"}}, due=False)
    assert reasons == ["a stub process disappeared"]


def test_watched_gives_the_probes_and_instances_of_the_models_served(tmp_path: Path) -> None:
    """What the watchdog watches of a served config: the ps.json's models and those the
    node's record adds at runtime (with their instances), without those it removes."""
    from hps.io.sparse_model import write_sparse_model
    from hps.versions.models import add_model, mark_removed, served_config

    config = make_config(tmp_path)
    probes, instances = watched(served_config(config))
    assert set(probes) == {"demo"} and instances == {"demo": 1}
    keys = np.arange(10, dtype=np.int64)
    write_sparse_model(tmp_path / "t", keys, np.ones((keys.size, 2), np.float32))
    add_model(config, ModelConfig.model_validate({
        "model": "extra", "sparse_files": [str(tmp_path / "t")], "hps_instances": 2,
        "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2],
    }))  # fmt: skip
    probes, instances = watched(served_config(config))
    assert instances == {"demo": 1, "extra": 2}
    assert probes["extra"]["NUMKEYS"].tolist() == [[1]]
    mark_removed(config, "extra")
    assert set(watched(served_config(config))[0]) == {"demo"}

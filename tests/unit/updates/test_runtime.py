"""The update threads of a serving process outlive any failure of one step (UpdateThread),
and the L1 listener drops L1 when a poll's messages may not have reached it."""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.build import build_session
from hps.config import PSConfig
from hps.errors import BackendUnavailable, ClientLost
from hps.lookup import LookupSession
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.updates import listener as listener_mod
from hps.updates import runtime
from hps.updates.runtime import UpdateThread
from tests.helpers import make_config
from tests.unit.updates.test_listener import upsert, versioned
from tests.unit.updates.test_update_consumer_loop import SPEC, Msg

HANG_S = 30.0  # hang guards only


def _wait(cond: Any, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_step_that_raises_does_not_end_the_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runtime, "RETRY_S", 0.0)
    failures: deque[Exception] = deque(
        [KeyError("created"), MemoryError("out of GPU memory"), BackendUnavailable("redis")]
    )
    done = threading.Event()
    closed: list[bool] = []

    def step(stop: threading.Event) -> None:
        if failures:
            raise failures.popleft()
        done.set()

    thread = UpdateThread("hps-test-updates", step, close=lambda: closed.append(True))
    assert done.wait(HANG_S)
    assert thread.is_alive() and thread.errors == 3
    assert isinstance(thread.error, BackendUnavailable)
    thread.stop()
    assert not thread.is_alive() and closed == [True]
    logged = [r for r in caplog.records if "hps-test-updates" in r.getMessage()]
    assert logged[0].exc_info is not None  # unforeseen: with its traceback
    assert "(2 in a row)" not in caplog.text  # later failures in a row are not all logged


class _Source:
    """The Kafka source of the listener: messages handed out in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.queue: deque[Msg] = deque()
        self.closed = False
        _Source.made.append(self)

    made: list[_Source] = []

    def poll(self, timeout_s: float) -> Msg | None:
        if self.queue:
            return self.queue.popleft()
        time.sleep(0.001)
        return None

    def drain(self, n: int) -> list[Msg]:
        out = []
        while self.queue and len(out) < n:
            out.append(self.queue.popleft())
        return out

    def committed(self) -> dict[tuple[str, int], int]:
        return {}

    def close(self) -> None:
        self.closed = True


def _listened(tmp_path: Path) -> tuple[PSConfig, LookupSession, np.ndarray]:
    """A one-table model whose L1 (a NumPy cache) holds keys 1-10 (all 1.0), read from an
    in-process L2, and the ps.json that gives it a listener's update source."""
    cfg = make_config(
        tmp_path,
        models=[{"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2],
                 "gpucache": True, "hps_cache": {"capacity": 100, "device": "numpy"}}],
        update_source={"type": "kafka_message_queue", "brokers": "127.0.0.1:1"},
    )  # fmt: skip
    l2 = HashMapStore()
    session = build_session(cfg, tiers=Tiers(l2, None))
    keys = np.arange(1, 11, dtype=np.int64)
    l2.insert(SPEC.name, keys, np.ones((keys.size, 2), np.float32))
    session.lookup(SPEC.name, keys)
    return cfg, session, keys


def test_the_listener_drops_l1_when_a_poll_fails_to_reach_it_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "RETRY_S", 0.0)
    monkeypatch.setattr(listener_mod, "MessageSource", _Source)
    real = listener_mod.refresh_from
    polls: list[int] = []  # messages per poll that reached refresh_from

    def refresh_once_failing(*args: Any, **kwargs: Any) -> None:
        if args[0]:
            polls.append(len(args[0]))
            if len(polls) == 1:
                raise MemoryError("out of GPU memory")  # part of the poll may be in L1, or not
        real(*args, **kwargs)

    monkeypatch.setattr(listener_mod, "refresh_from", refresh_once_failing)
    cfg, session, keys = _listened(tmp_path)
    cache = session.caches[SPEC.name]
    assert cache.resident(keys).all()
    _Source.made.clear()
    thread = listener_mod.start_l1_listener(session, cfg)
    try:
        [first] = _Source.made
        first.queue.append(upsert([1], 5.0, 0))
        _wait(lambda: thread.errors == 1, "the failed poll")
        _wait(lambda: not cache.resident(keys).any(), "L1 dropped")
        # a new client reads on from the group's committed offsets: the failed poll's
        # messages again (hps consume may not have applied them), then the next ones
        _wait(lambda: len(_Source.made) == 2, "a new client")
        assert first.closed
        second = _Source.made[1]
        session.lookup(SPEC.name, keys[1:3])  # back from L2
        second.queue.extend([upsert([1], 5.0, 0), upsert([2], 7.0, 1)])
        _wait(lambda: len(polls) == 2, "the next poll")
        _wait(lambda: session.lookup(SPEC.name, keys[1:2])[0, 0] == 7.0, "key 2 refreshed")
        assert thread.is_alive() and thread.errors == 1
    finally:
        thread.stop()
        session.close()
    assert second.closed


def test_rows_warmed_before_the_listener_started_are_read_again_from_l2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update hps consume applied and committed after the warm-up read a row, but before
    the listener took its start (the group's committed offsets), never comes from the
    topics: the listener's start reads the resident rows again from L2/L3."""
    monkeypatch.setattr(listener_mod, "MessageSource", _Source)
    cfg, session, keys = _listened(tmp_path)  # L1 warmed with 1.0
    assert session.tiers.volatile is not None
    session.tiers.volatile.insert(SPEC.name, keys[:3], np.full((3, 2), 9.0, np.float32))
    assert session.lookup(SPEC.name, keys[:1])[0, 0] == 1.0  # L1 is behind L2
    thread = listener_mod.start_l1_listener(session, cfg)
    try:
        got = session.lookup(SPEC.name, keys)
        assert (got[:3] == 9.0).all() and (got[3:] == 1.0).all()
        assert session.caches[SPEC.name].resident(keys).all()  # re-read, not dropped
    finally:
        thread.stop()
        session.close()


def test_the_listener_keeps_a_newer_row_from_a_later_older_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across polls: a message older than the row pass 1 gave L1 (another partition, a
    retry) leaves that row, where ``hps consume`` refuses it in L2 too."""
    monkeypatch.setattr(listener_mod, "MessageSource", _Source)
    cfg, session, keys = _listened(tmp_path)
    _Source.made.clear()
    thread = listener_mod.start_l1_listener(session, cfg)
    try:
        [source] = _Source.made
        source.queue.append(versioned([1], 104.0, 1_000_002, 0, partition=1))
        _wait(lambda: session.lookup(SPEC.name, keys[:1])[0, 0] == 104.0, "the newer row")
        source.queue.append(versioned([1], 99.0, 1_000_001, 0, partition=0))  # older, later
        source.queue.append(versioned([2], 7.0, 1_000_003, 1, partition=0))
        _wait(lambda: session.lookup(SPEC.name, keys[1:2])[0, 0] == 7.0, "the poll after")
        assert session.lookup(SPEC.name, keys[:1])[0, 0] == 104.0
        assert session.caches[SPEC.name].resident(keys[:1]).all()
    finally:
        thread.stop()
        session.close()


class _LostSource(_Source):
    """The first client is lost at its first poll; making the next fails once (broker away)."""

    attempts = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _LostSource.attempts += 1
        if _LostSource.attempts == 2:
            raise BackendUnavailable("kafka: creating topics: _TRANSPORT: broker down")
        super().__init__(*args, **kwargs)
        self.polls = 0

    def poll(self, timeout_s: float) -> Msg | None:
        self.polls += 1
        if self is _Source.made[0]:
            raise ClientLost("kafka: fatal consumer error: _FENCED")
        return super().poll(timeout_s)


def test_the_listener_makes_a_lost_client_anew_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "RETRY_S", 0.0)
    monkeypatch.setattr(listener_mod, "MessageSource", _LostSource)
    cfg, session, keys = _listened(tmp_path)
    _Source.made.clear()
    _LostSource.attempts = 0
    thread = listener_mod.start_l1_listener(session, cfg)
    try:
        _wait(lambda: len(_Source.made) == 2, "a new client")
        first, second = _Source.made
        second.queue.append(upsert([2], 7.0, 0))
        _wait(lambda: session.lookup(SPEC.name, keys[1:2])[0, 0] == 7.0, "key 2 refreshed")
        assert first.closed and first.polls == 1 and _LostSource.attempts == 3
    finally:
        thread.stop()
        session.close()


def test_a_shared_l2_consumer_with_a_record_of_its_own_is_told() -> None:
    from hps.config import parse_config
    from hps.updates.runtime import unshared_version_record

    doc = {
        "models": [
            {"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2]}
        ],
        "volatile_db": {"type": "redis", "address": "127.0.0.1:6379"},
        "persistent_db": {"type": "disabled"},
        "update_source": {"type": "kafka_message_queue", "brokers": "127.0.0.1:9092"},
    }
    l2_only = parse_config(doc, "/etc/hps/ps-l2.json")
    own = Path("/tmp/hps-0123456789abcdef.hps-versions.json")  # a read-only config folder
    assert "version 1 of each model only" in (unshared_version_record(l2_only, own) or "")
    beside = Path("/etc/hps/ps-l2.hps-versions.json")
    assert unshared_version_record(l2_only, beside) is None
    with_l3 = parse_config({**doc, "persistent_db": {"type": "rocks_db", "path": "/l3/db"}},
                           "/etc/hps/ps.json")  # fmt: skip
    assert unshared_version_record(with_l3, own) is None


def test_the_consumer_opens_version_1_as_recorded_not_as_the_ps_json_says_now(
    tmp_path: Path,
) -> None:
    """A retrain stored in another row format is imported as version 3 from a ps.json
    edited for it: `hps consume` still opens version 1's tables as they were imported
    (float32, as L3 holds them), not as the edited entry says (float16)."""
    import json

    from hps.config import load_config
    from hps.io.sparse_model import write_sparse_model
    from hps.triton.serving import prepare_tables, serving_config
    from hps.versions import VersionRegistry
    from hps.versions.rollout import import_version, version_entry
    from tests.helpers import rows

    keys = np.arange(50, dtype=np.int64)

    def tables(folder: Path, seed: int) -> list[str]:
        out = []
        for name, dim in (("t0", 4), ("t1", 8)):
            write_sparse_model(folder / name, keys, rows(keys, dim, seed))
            out.append(str(folder / name))
        return out

    doc = make_config(tmp_path).model("demo").model_dump(mode="json")
    doc["sparse_files"] = tables(tmp_path / "v1", 0)
    ps = {"models": [doc], "volatile_db": {"type": "hash_map"},
          "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
          "update_source": {"type": "kafka", "brokers": "127.0.0.1:1"}}  # fmt: skip
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(ps))
    config = serving_config(path)
    prepare_tables(config)
    v2 = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", 7))
    import_version(config, v2, 2)
    doc["hps_row_dtype"] = "float16"  # the next retrain is stored as float16
    path.write_text(json.dumps(ps))
    config = serving_config(path)
    v3 = version_entry(config, "demo", sparse_files=tables(tmp_path / "v3", 9))
    import_version(config, v3, 3)
    VersionRegistry(config).set_live("demo", 3)

    consumed = runtime.consumed_config(load_config(path))
    assert {t.row_dtype for t in consumed.model("demo").tables} == {"float32"}
    build_session(consumed, with_cache=False).close()  # opens: L3 holds them as float32


def test_the_listener_replaces_a_lost_client_and_drops_l1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client with a fatal error fails every call: a new one tails from then on, and L1
    (which may have missed what the lost one did not hand out) is read again from L2."""
    from hps.errors import ClientLost

    class Lost(_Source):
        def poll(self, timeout_s: float) -> Msg | None:
            if len(_Source.made) == 1:
                raise ClientLost("kafka: fatal consumer error: _FENCED: fenced")
            return super().poll(timeout_s)

    monkeypatch.setattr(runtime, "RETRY_S", 0.0)
    monkeypatch.setattr(listener_mod, "MessageSource", Lost)
    cfg, session, keys = _listened(tmp_path)
    cache = session.caches[SPEC.name]
    _Source.made.clear()
    thread = listener_mod.start_l1_listener(session, cfg)
    try:
        _wait(lambda: len(_Source.made) == 2, "a new client")
        first, second = _Source.made
        assert first.closed and not cache.resident(keys).any()
        session.lookup(SPEC.name, keys[1:2])  # resident again, from L2
        second.queue.append(upsert([2], 7.0, 0))
        _wait(lambda: session.lookup(SPEC.name, keys[1:2])[0, 0] == 7.0, "key 2 refreshed")
        assert thread.is_alive() and thread.errors == 1 and isinstance(thread.error, ClientLost)
    finally:
        thread.stop()
        session.close()
    assert second.closed

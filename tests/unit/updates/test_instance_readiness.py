"""A serving instance's shared-L2 problem reaches the control plane's ``/readyz``.

The watch of a serving process that leaves the refill to ``hps consume`` reports not-ready
until the new segment records a fill; the instance's change-journal heartbeat carries its
problem (written at once when it changes); ``/readyz``'s ``instances`` check fails with the
reason while a live instance reports one, and passes again when it clears. Real
shared-memory segments and a real journal folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.service.health import readiness
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.storage.hash_map import HashMapStore
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.tiers import Tiers
from hps.tiers.shared_l2 import SharedL2Watch
from hps.types import JSON, TableSpec
from hps.updates.journal import LIVE_S, Journal, journal_dir
from hps.updates.journal_follower import JournalFollower
from tests.helpers import make_config, unique_name

SPEC = TableSpec("demo", "t0", 4)
KEYS = np.arange(200, dtype=np.int64)


@pytest.fixture
def name() -> Iterator[str]:
    n = unique_name("hps_ready")
    yield n
    for suffix in ("", ".lock", ".users", ".turn"):
        path = f"/dev/shm/{n}{suffix}"
        if os.path.exists(path):
            os.unlink(path)


def _store(name: str) -> SharedHashMapStore:
    store = SharedHashMapStore(name, 8 * 1024 * 1024, identity_check_s=None)
    store.open_table(SPEC)
    return store


def _tiers(store: SharedHashMapStore, *, l2: bool = True) -> Tiers:
    """The store over an L3 of its own holding KEYS (written to the store too if ``l2``)."""
    tiers = Tiers(store, HashMapStore())
    tiers.open_tables([SPEC])
    rows = np.full((KEYS.size, SPEC.dim), 3.0, np.float32)
    if l2:
        tiers.write(SPEC.name, KEYS, rows)
    else:
        assert tiers.persistent is not None
        tiers.persistent.insert(SPEC.name, KEYS, rows)
    return tiers


def _remove_files(store: SharedHashMapStore) -> None:
    for suffix in ("", ".lock", ".users", ".turn"):
        os.unlink(store.path + suffix)


def test_a_serving_watch_waits_for_the_consumers_refill(name: str) -> None:
    serving, consumer = _store(name), _store(name)
    ts, tc = _tiers(serving), _tiers(consumer)
    ws = SharedL2Watch(serving, ts, [SPEC], fill="none", interval_s=0.0)
    wc = SharedL2Watch(consumer, tc, [SPEC], fill="overwrite", interval_s=0.0)
    _remove_files(serving)
    assert ws.check(force=True)  # moved to a new, empty segment; refilling is not its job
    problem = ws.problem()
    assert problem is not None and "waiting for hps consume" in problem
    assert serving.size(SPEC.name) == 0
    assert wc.check(force=True) and wc.problem() is None  # the consumer moves and refills
    assert not ws.check(force=True)  # sees the fill recorded: L1 re-read, ready again
    assert ws.problem() is None and serving.size(SPEC.name) == KEYS.size
    # a serving process that moves after the consumer's refill has nothing to wait for
    _remove_files(consumer)
    assert wc.check(force=True) and ws.check(force=True)
    assert ws.problem() is None
    ts.close()
    tc.close()


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


def _instances_check(state: AdminState) -> JSON:
    ok, checks = readiness(state)
    assert not ok  # no Triton here: only the instances check is looked at
    return next(c for c in checks if c["name"] == "instances")


def test_an_instance_problem_fails_readyz_until_it_clears(config: PSConfig, tmp_path: Path) -> None:
    state = AdminState(config, None, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "s")
    journal = Journal(journal_dir(Path(config.persistent_db.path)))
    follower = JournalFollower(journal, "demo_0.1234", "demo")
    other = JournalFollower(journal, "demo_1.5678", "demo")
    check = _instances_check(state)
    assert check["ok"] and check["detail"].startswith("2 live serving instance(s)")
    problem: list[str | None] = ["shared L2 /dev/shm/x was replaced: refilling it from L3"]
    follower.report(lambda: problem[0])
    check = _instances_check(state)
    assert not check["ok"]
    assert "demo_0.1234: shared L2 /dev/shm/x was replaced" in check["detail"]
    assert "demo_1.5678" not in check["detail"]
    problem[0] = None
    follower._heartbeat(force=False)  # a poll: the change is written at once
    assert _instances_check(state)["ok"]
    problem[0] = "again"
    follower._heartbeat(force=False)
    assert not _instances_check(state)["ok"]
    follower.stop()  # a stopped instance's cursor goes: nothing left to wait for
    assert _instances_check(state)["ok"]
    other.stop()


def test_a_dead_instances_problem_does_not_hold_readiness(config: PSConfig, tmp_path: Path) -> None:
    state = AdminState(config, None, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "s")
    journal = Journal(journal_dir(Path(config.persistent_db.path)))
    follower = JournalFollower(journal, "demo_0.99", "demo")
    follower.report(lambda: "stuck")
    assert not _instances_check(state)["ok"]
    cursor = journal.readers_dir / "demo_0.99.json"
    doc = json.loads(cursor.read_text())
    doc["time"] -= 2 * LIVE_S  # its last heartbeat long ago: the process is gone
    cursor.write_text(json.dumps(doc))
    check = _instances_check(state)
    assert check["ok"] and check["detail"].startswith("0 live")


def test_a_failing_report_is_a_problem_not_a_dead_follower(config: PSConfig) -> None:
    journal = Journal(journal_dir(Path(config.persistent_db.path)))
    follower = JournalFollower(journal, "demo_0.7", "demo")

    def broken() -> str | None:
        raise RuntimeError("segment gone")

    follower.report(broken)
    (cursor,) = journal.cursors()
    assert cursor.problem is not None and "segment gone" in cursor.problem
    follower.stop()


def test_a_consumer_started_after_the_move_fills_the_segment_serving_waits_on(
    name: str,
) -> None:
    serving = _store(name)
    ts = _tiers(serving)
    ws = SharedL2Watch(serving, ts, [SPEC], fill="none", interval_s=0.0)
    _remove_files(serving)  # while hps consume is down
    assert ws.check(force=True) and ws.problem() is not None
    consumer = _store(name)  # hps consume starts: it opens the segment serving moved to
    tc = _tiers(consumer, l2=False)
    wc = SharedL2Watch(consumer, tc, [SPEC], fill="overwrite", interval_s=0.0)
    assert wc.check(force=True)  # an empty segment no fill reached: filled first
    assert consumer.size(SPEC.name) == KEYS.size and consumer.filled() == 1
    ws.check(force=True)
    assert ws.problem() is None
    assert not wc.check(force=True)  # once only
    ts.close()
    tc.close()

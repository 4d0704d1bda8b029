"""Which model versions an update goes to: the rules, the record they read, and what a
consumer owes a version that was loading."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hps.config import PSConfig
from hps.errors import UnknownTableError
from hps.types import TableSpec
from hps.updates.replay import Rollouts, record_path
from hps.updates.routing import SKEW_S, Point, Router, VersionWatch, start_ms, targets
from hps.versions import VersionRegistry
from tests.helpers import make_config

T = 1_800_000_000_000  # a message timestamp (ms)


def points(**states: str) -> dict[int, Point]:
    """``v1="live", v3="ready"`` -> versions 1 and 3, imported long before ``T``."""
    return {int(k[1:]): Point(state, 0) for k, state in states.items()}  # type: ignore[arg-type]


def test_untagged_goes_to_the_live_version_and_the_ready_ones_above_it() -> None:
    versions = points(v1="ready", v2="live", v3="ready", v4="loading", v5="retired")
    assert targets("demo", versions, None, T) == (2, 3)
    assert targets("demo", points(v1="live"), None, T) == (1,)


def test_tagged_goes_to_its_version_when_ready_or_live() -> None:
    versions = points(v1="ready", v2="live", v3="ready")
    assert [targets("demo", versions, n, T) for n in (1, 2, 3)] == [(1,), (2,), (3,)]


def test_tagged_for_a_loading_version_waits() -> None:
    assert targets("demo", points(v1="live", v2="loading"), 2, T) == ()


def test_tagged_for_an_unknown_or_retired_version_is_a_dead_letter() -> None:
    versions = points(v1="live", v3="retired")
    with pytest.raises(UnknownTableError, match="model demo has no version 7"):
        targets("demo", versions, 7, T)
    with pytest.raises(UnknownTableError, match="version 3 is retired"):
        targets("demo", versions, 3, T)


def test_a_version_takes_only_what_was_published_since_its_import_began() -> None:
    created = T / 1000
    versions = {1: Point("live", 0), 2: Point("ready", start_ms(created))}
    assert start_ms(created) == T - int(SKEW_S * 1000)
    assert targets("demo", versions, None, T) == (1, 2)
    assert targets("demo", versions, None, T - 60_000) == (1,)  # before v2's import
    assert targets("demo", versions, None, 0) == (1, 2)  # no timestamp: no bound
    with pytest.raises(UnknownTableError, match="version 2 was begun after"):
        targets("demo", versions, 2, T - 60_000)


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


def test_the_watch_rereads_the_record_only_when_its_file_changes(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    watch = VersionWatch(registry, ["demo"])
    assert watch.points == {"demo": {1: Point("live", 0)}}
    assert not watch.refresh()  # no file, still none
    registry.begin(config.model("demo"), 2)
    assert watch.refresh() and watch.points["demo"][2].state == "loading"
    assert not watch.refresh()  # unchanged: one stat, no read
    registry.set_state("demo", 2, "ready")
    assert watch.refresh() and watch.points["demo"][2].state == "ready"
    assert watch.points["demo"][2].start_ms > 0 and watch.points["demo"][1].start_ms == 0
    assert [s.name for s in watch.tables("demo", 2)] == ["demo.t0@2", "demo.t1@2"]


def test_a_record_replaced_between_two_reads_keeps_the_last_reading(
    config: PSConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pass reads the record once per model: a model gone between two reads (the
    record replaced meanwhile) keeps the last reading until the next poll reads it again."""
    registry = VersionRegistry(config)
    watch = VersionWatch(registry, ["demo"])
    registry.begin(config.model("demo"), 2)
    real = registry.versions

    def gone(model: str) -> object:
        raise UnknownTableError(f"unknown model {model!r}")

    monkeypatch.setattr(registry, "versions", gone)
    assert not watch.refresh() and set(watch.points["demo"]) == {1}
    monkeypatch.setattr(registry, "versions", real)
    assert watch.refresh() and set(watch.points["demo"]) == {1, 2}


def test_the_router_gives_each_version_its_own_tables(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    base = {s.name: s for s in config.model("demo").tables}
    router = Router(base, VersionWatch(registry, ["demo"]))
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    router.refresh()
    now = int(time.time() * 1000)
    assert [s.name for s in router.route("demo", "t0", None, now)] == ["demo.t0", "demo.t0@2"]
    assert [s.name for s in router.route("demo", "t1", 2, now)] == ["demo.t1@2"]
    assert router.route("demo", "t0", None, now, only=2)[0].version == 2
    with pytest.raises(UnknownTableError, match="no configured table demo.t9"):
        router.route("demo", "t9", None, now)
    with pytest.raises(UnknownTableError, match="no configured table other.t0"):
        router.route("other", "t0", None, now)


def test_a_serving_instance_routes_to_its_own_version_only(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    v2 = {s.name: s for s in registry.model_at("demo", 2).tables}
    v1 = {s.name: s for s in config.model("demo").tables}
    on_v2 = Router(v2, VersionWatch(registry, ["demo"]), own=True)
    on_v1 = Router(v1, VersionWatch(registry, ["demo"]), own=True)
    now = int(time.time() * 1000)
    assert [s.name for s in on_v2.route("demo", "t0", None, now)] == ["demo.t0@2"]
    assert [s.name for s in on_v1.route("demo", "t0", None, now)] == ["demo.t0"]
    assert on_v1.route("demo", "t0", 2, now) == []  # another version's: not this instance's
    assert [s.name for s in on_v2.route("demo", "t0", 2, now)] == ["demo.t0@2"]
    assert on_v2.own_starts() == {
        "hps_et.demo.t0": on_v2.watch.points["demo"][2].start_ms,
        "hps_et.demo.t1": on_v2.watch.points["demo"][2].start_ms,
    }
    assert on_v1.own_starts() == {}  # version 1 predates versions: from the beginning
    with pytest.raises(UnknownTableError, match="no version 5"):
        on_v1.route("demo", "t0", 5, now)


def test_a_static_router_serves_fixed_tables() -> None:
    spec = TableSpec("m", "t", 2)
    router = Router.fixed({spec.name: spec})
    assert router.route("m", "t", None, T) == [spec] == router.route("m", "t", 1, T)
    assert not router.refresh()
    with pytest.raises(UnknownTableError, match="no version 2"):
        router.route("m", "t", 2, T)


def test_a_version_seen_loading_is_owed_a_replay_across_restarts(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    path = record_path(registry, "g1")
    assert path is not None and path.parent == registry.path.parent  # type: ignore[union-attr]
    watch = VersionWatch(registry, ["demo"])
    rollouts = Rollouts(path)
    rollouts.observe(watch.points)
    assert not rollouts.due and not path.exists()
    registry.begin(config.model("demo"), 2)
    watch.refresh()
    rollouts.observe(watch.points)
    assert rollouts.owed == {("demo", 2)} and not rollouts.due
    assert json.loads(path.read_text()) == {"demo": [2]}
    # the consumer stops; the import completes meanwhile; the next one starts
    registry.set_state("demo", 2, "ready")
    restarted = Rollouts(path)
    restarted.observe(VersionWatch(registry, ["demo"]).points)
    assert restarted.due == {("demo", 2)}
    restarted.done(("demo", 2))
    assert json.loads(path.read_text()) == {} and not restarted.due
    assert record_path(registry, "g2") != path  # one record per consumer group


def test_a_version_that_appears_ready_between_two_readings_is_due(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    watch = VersionWatch(registry, ["demo"])
    rollouts = Rollouts(record_path(registry, "g"))
    rollouts.observe(watch.points)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")  # begun and ready before the next reading
    watch.refresh()
    rollouts.observe(watch.points)
    assert rollouts.due == {("demo", 2)}


def test_a_failed_or_retired_version_owes_nothing(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    watch = VersionWatch(registry, ["demo"])
    rollouts = Rollouts(record_path(registry, "g"))
    registry.begin(config.model("demo"), 2)
    registry.begin(config.model("demo"), 3)
    watch.refresh()
    rollouts.observe(watch.points)
    registry.forget("demo", 2)  # its import failed
    registry.set_state("demo", 3, "retired")
    watch.refresh()
    rollouts.observe(watch.points)
    assert not rollouts.owed and not rollouts.due


def test_versions_present_at_the_first_reading_owe_nothing(config: PSConfig) -> None:
    """A consumer that starts after a version became ready consumed nothing meanwhile:
    what it reads from now on is routed with that version ready."""
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    rollouts = Rollouts(record_path(registry, "g"))
    rollouts.observe(VersionWatch(registry, ["demo"]).points)
    assert not rollouts.due


def test_a_consumer_that_may_have_lost_its_record_replays_recent_versions() -> None:
    """``recent_s``: at the first reading, versions imported within it owe a replay (the
    record of those seen loading may be gone with the consumer's pod); older ones, version
    1 of before versions, and later readings add nothing."""
    now_ms = int(time.time() * 1000)
    points = {
        "m": {
            1: Point("ready", 0),
            2: Point("live", now_ms - 600_000),
            3: Point("ready", now_ms - 7_200_000),
            4: Point("loading", now_ms),
        }
    }
    rollouts = Rollouts(None, recent_s=3600)
    rollouts.observe(points)
    assert rollouts.due == {("m", 2)} and rollouts.owed == {("m", 2), ("m", 4)}
    rollouts.done(("m", 2))
    rollouts.observe(points)  # a later reading: nothing new
    assert not rollouts.due
    default = Rollouts(None)
    default.observe(points)
    assert not default.due


def test_an_unreadable_owed_record_is_ignored_with_a_warning(config: PSConfig) -> None:
    path = record_path(VersionRegistry(config), "g")
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert Rollouts(path).owed == set()
    os.unlink(path)

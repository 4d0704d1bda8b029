"""``hps consume`` follows the models the node serves: a model added at runtime is subscribed
and its updates applied, a removed one is left and its messages dead-lettered (an
in-memory message source; real stores, a real version record, the real add/remove)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.config import ModelConfig, PSConfig, UpdateSourceConfig
from hps.errors import BackendUnavailable, UnknownTableError
from hps.io.sparse_model import write_sparse_model
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.updates import codec
from hps.updates.applier import Applier
from hps.updates.consumer import UpdateConsumer
from hps.updates.following import ModelFollower
from hps.updates.replay import Rollouts
from hps.updates.routing import Point, Router, VersionWatch, served_models
from hps.updates.runtime import consumed_config
from hps.versions import VersionRegistry
from hps.versions.models import add_model, mark_removed, purge
from tests.helpers import make_config
from tests.unit.updates.test_update_consumer_loop import FakeDead, FakeSource
from tests.unit.updates.test_update_version_loop import Stamped

DEMO = ["hps_et.demo.t0", "hps_et.demo.t1"]


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


def extra(tmp_path: Path) -> ModelConfig:
    keys = np.arange(20, dtype=np.int64)
    write_sparse_model(tmp_path / "extra" / "t", keys, np.full((20, 2), 3.0, np.float32))
    return ModelConfig.model_validate({
        "model": "extra", "sparse_files": [str(tmp_path / "extra" / "t")],
        "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2],
    })  # fmt: skip


def upsert(model: str, table: str, keys: list[int], dim: int, offset: int) -> Stamped:
    k = np.array(keys)
    values = np.repeat(k[:, None], dim, 1).astype(np.float32)
    return Stamped(codec.encode(k, values, time.time_ns()), offset, codec.topic_name(model, table))


class Subscribing(FakeSource):
    """A source that records its subscriptions (and fails the first ``failures`` of them)."""

    def __init__(self, topics: list[str], failures: int = 0) -> None:
        super().__init__([])
        self.topics = topics
        self.subscriptions: list[list[str]] = []
        self.failures = failures

    @property
    def assignment(self) -> list[tuple[str, int]]:
        return [(t, 0) for t in self.topics]

    def subscribe(self, topics: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("kafka: subscribing: _TRANSPORT: broker down")
        self.topics = list(topics)
        self.subscriptions.append(list(topics))


class FailingOnce(HashMapStore):
    """An L3 whose first write once ``meanwhile`` is set fails, after running it (a tier
    down while the node's record changes)."""

    meanwhile: Callable[[], object] | None = None

    def insert(self, table: str, keys: Any, values: Any, **kw: Any) -> None:
        if self.meanwhile is not None:
            self.meanwhile()
            self.meanwhile = None
            raise BackendUnavailable("l3 away")
        super().insert(table, keys, values, **kw)


def following(
    config: PSConfig,
    failures: int = 0,
    l3: HashMapStore | None = None,
    *,
    drop_retired: bool = False,
) -> tuple[UpdateConsumer, Subscribing, Tiers]:
    tiers = Tiers(HashMapStore(), l3 or HashMapStore())
    applier = Applier({s.name: s for s in config.model("demo").tables}, tiers)
    watch = VersionWatch(VersionRegistry(config), ["demo"], follow=True)
    router = Router(applier.tables, watch, takes=applier.takes)
    source = Subscribing(router.topics(), failures)
    consumer = UpdateConsumer(
        source,  # type: ignore[arg-type]
        applier,
        UpdateSourceConfig(type="kafka", failure_backoff_ms=1, max_batch_size=1000),
        dead_letters=FakeDead(),  # type: ignore[arg-type]
        router=router,
        follower=ModelFollower(router, source, applier, drop_retired=drop_retired),
    )
    return consumer, source, tiers


def found(tiers: Tiers, table: str, keys: list[int]) -> list[bool]:
    assert tiers.persistent is not None
    return tiers.persistent.fetch(table, np.array(keys))[1].tolist()


def test_the_watch_follows_the_served_models(config: PSConfig, tmp_path: Path) -> None:
    registry = VersionRegistry(config)
    watch = VersionWatch(registry, ["demo"], follow=True)
    router = Router({s.name: s for s in config.model("demo").tables}, watch)
    assert (watch.models, router.topics()) == (["demo"], DEMO)
    add_model(config, extra(tmp_path))
    assert router.refresh() and watch.models == ["demo", "extra"]
    assert router.topics() == [*DEMO, "hps_et.extra.t"]
    now = int(time.time() * 1000)
    assert [s.name for s in router.route("extra", "t", None, now)] == ["extra.t"]
    mark_removed(config, "extra")
    assert router.refresh() and watch.models == ["demo"] and watch.removed == {"extra"}
    assert router.topics() == DEMO
    with pytest.raises(UnknownTableError, match="model extra was removed"):
        router.route("extra", "t", None, now)
    purge(config, "extra")
    assert router.refresh() and watch.removed == {"extra"}
    assert served_models(registry) == (["demo"], set())  # a runtime model it never knew
    assert served_models(registry, ["extra"]) == (["demo"], {"extra"})
    unfollowed = VersionWatch(registry, ["demo"])  # a serving instance: its own model only
    assert unfollowed.models == ["demo"] and not unfollowed.removed


def test_a_model_added_at_runtime_is_consumed_and_a_removed_one_left(
    config: PSConfig, tmp_path: Path
) -> None:
    consumer, source, tiers = following(config)
    stop = threading.Event()
    add_model(config, extra(tmp_path))
    source.queue.extend([upsert("extra", "t", [1, 2], 2, 0), upsert("demo", "t0", [1], 4, 1)])
    consumer.run_once(stop)  # the record changed: subscribed before the poll
    assert source.subscriptions == [[*DEMO, "hps_et.extra.t"]]
    assert found(tiers, "extra.t", [1, 2, 3]) == [True, True, False]
    assert found(tiers, "demo.t0", [1]) == [True]
    assert "extra.t" in consumer.applier.tables  # opened in the consumer's tiers

    mark_removed(config, "extra")
    purge(config, "extra")
    source.queue.extend([upsert("extra", "t", [3], 2, 2), upsert("demo", "t0", [2], 4, 3)])
    consumer.run_once(stop)  # a message of it still in flight: a dead letter
    assert source.subscriptions[-1] == DEMO
    assert found(tiers, "extra.t", [3]) == [False] and found(tiers, "demo.t0", [2]) == [True]
    dead: FakeDead = consumer.dead_letters  # type: ignore[assignment]
    reason = "UnknownTableError: model extra was removed: its updates are not applied"
    assert dead.sent == [(2, reason)]
    assert "extra.t" not in consumer.applier.tables
    assert source.stored == [0, 1, 2, 3]


def test_a_failed_subscription_is_tried_again_before_the_next_poll(
    config: PSConfig, tmp_path: Path
) -> None:
    consumer, source, _ = following(config, failures=1)
    add_model(config, extra(tmp_path))
    consumer.run_once(threading.Event())
    assert source.subscriptions == [] and consumer.follower and consumer.follower.pending
    consumer.run_once(threading.Event())  # the record is unchanged: the change is still owed
    assert source.subscriptions == [[*DEMO, "hps_et.extra.t"]]
    assert not consumer.follower.pending


def test_a_batch_held_up_by_a_tier_drops_a_model_removed_meanwhile(
    config: PSConfig, tmp_path: Path
) -> None:
    add_model(config, extra(tmp_path))
    l3 = FailingOnce()
    consumer, source, tiers = following(config, l3=l3)
    l3.meanwhile = lambda: mark_removed(config, "extra")
    source.queue.extend([upsert("extra", "t", [1], 2, 0), upsert("demo", "t0", [1], 4, 1)])
    consumer.run_once(threading.Event())  # routed to both; L3 fails; extra removed meanwhile
    assert found(tiers, "extra.t", [1]) == [False] and found(tiers, "demo.t0", [1]) == [True]
    assert source.stored == [0, 1]


def test_a_batch_held_up_by_a_tier_drops_a_version_retired_meanwhile(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")  # untagged updates reach it too
    l3 = FailingOnce()
    consumer, source, tiers = following(config, l3=l3)
    source.queue.append(upsert("demo", "t0", [1], 4, 0))
    consumer.run_once(threading.Event())  # routed to versions 1 and 2
    assert found(tiers, "demo.t0@2", [1]) == [True]
    l3.meanwhile = lambda: registry.set_state("demo", 2, "retired")  # its rows dropped
    source.queue.append(upsert("demo", "t0", [2], 4, 1))
    consumer.run_once(threading.Event())  # routed to both; L3 fails; 2 retired meanwhile
    assert found(tiers, "demo.t0", [1, 2]) == [True, True]
    assert found(tiers, "demo.t0@2", [1, 2]) == [True, False]  # not written again
    assert source.stored == [0, 1]


def test_a_removed_model_owes_no_replay() -> None:
    rollouts = Rollouts(None)
    rollouts.observe({"demo": {1: Point("live", 0)}, "extra": {1: Point("loading", 0)}})
    assert rollouts.owed == {("extra", 1)}
    rollouts.observe({"demo": {1: Point("live", 0)}})  # extra removed while it loaded
    assert not rollouts.owed and not rollouts.due


def test_hps_consume_starts_with_the_models_as_served(config: PSConfig, tmp_path: Path) -> None:
    add_model(config, extra(tmp_path))
    assert [m.model for m in consumed_config(config).models] == ["demo", "extra"]
    mark_removed(config, "demo")
    assert [m.model for m in consumed_config(config).models] == ["extra"]


class FailingDrop(HashMapStore):
    """An L3 whose next ``failures`` table drops fail (a tier away)."""

    failures = 0

    def drop_table(self, table: str) -> None:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("l3 away")
        super().drop_table(table)


def test_a_consumer_of_the_nodes_records_drops_what_it_wrote_into_a_retired_version(
    config: PSConfig,
) -> None:
    """With the serving nodes' merged record (hps consume --versions-from-l2) the retire's
    drop ran elsewhere, maybe before this consumer's last batch: it drops its own tables of
    the version once it reads it retired, again before the next poll if that failed."""
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    l3 = FailingDrop()
    consumer, source, tiers = following(config, l3=l3, drop_retired=True)
    source.queue.append(upsert("demo", "t0", [1], 4, 0))
    consumer.run_once(threading.Event())
    assert found(tiers, "demo.t0@2", [1]) == [True]
    l3.failures = 1
    registry.set_state("demo", 2, "retired")  # the node dropped its rows; these are ours
    consumer.run_once(threading.Event())
    assert consumer.follower is not None and consumer.follower.pending
    assert found(tiers, "demo.t0@2", [1]) == [True]
    consumer.run_once(threading.Event())  # the record is unchanged: the drop is still owed
    assert not consumer.follower.pending
    with pytest.raises(UnknownTableError):  # dropped, not declared again
        found(tiers, "demo.t0@2", [1])
    assert found(tiers, "demo.t0", [1]) == [True]
    assert "demo.t0@2" not in consumer.applier.tables


def test_a_consumer_of_the_nodes_records_drops_what_it_wrote_of_a_purged_model(
    config: PSConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A purge (every version retired, the model removed) on the serving node dropped the
    rows there; the consumer drops its own, once, and warns once while it cannot."""
    add_model(config, extra(tmp_path))
    l3 = FailingDrop()
    consumer, source, tiers = following(config, l3=l3, drop_retired=True)
    source.queue.append(upsert("extra", "t", [1, 2], 2, 0))
    consumer.run_once(threading.Event())
    assert found(tiers, "extra.t", [1, 2]) == [True, True]
    l3.failures = 3
    mark_removed(config, "extra")
    purge(config, "extra")
    for _ in range(3):  # the drop fails three times: one warning
        consumer.run_once(threading.Event())
    warned = [r for r in caplog.records if "not dropped" in r.getMessage()]
    assert len(warned) == 1 and consumer.follower is not None and consumer.follower.pending
    consumer.run_once(threading.Event())
    assert not consumer.follower.pending
    with pytest.raises(UnknownTableError):
        found(tiers, "extra.t", [1])
    assert "extra.t" not in consumer.applier.tables

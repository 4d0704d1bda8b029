"""The consumer loop routes each message to the model versions it goes to (an in-memory
message source, real stores and a real version record)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig, UpdateSourceConfig
from hps.errors import UnknownTableError
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.updates import codec
from hps.updates.applier import Applier
from hps.updates.consumer import UpdateConsumer
from hps.updates.routing import Router, VersionWatch
from hps.versions import VersionRegistry
from tests.helpers import make_config
from tests.unit.updates.test_update_consumer_loop import FakeDead, FakeSource, Msg


class Stamped(Msg):
    """A message stamped now (a version takes what was published since its import began)."""

    def __init__(self, value: bytes, offset: int, topic: str) -> None:
        super().__init__(value, offset, topic)
        self.ts_ms = int(time.time() * 1000)

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts_ms)


def upsert(keys: list[int], offset: int, tag: int | None = None, seed: float = 0) -> Stamped:
    k = np.array(keys)
    values = np.repeat(k[:, None], 4, 1).astype(np.float32) + seed
    payload = codec.encode(k, values, time.time_ns(), model_version=tag)
    return Stamped(payload, offset, codec.topic_name("demo", "t0"))


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


def consumer_for(config: PSConfig, msgs: list[Stamped]) -> tuple[UpdateConsumer, FakeDead, Tiers]:
    tiers = Tiers(HashMapStore(), HashMapStore())
    base = {s.name: s for s in config.model("demo").tables}
    applier = Applier(base, tiers)
    router = Router(applier.tables, VersionWatch(VersionRegistry(config), ["demo"]))
    dead = FakeDead()
    settings = UpdateSourceConfig(type="kafka", failure_backoff_ms=1, max_batch_size=1000)
    consumer = UpdateConsumer(
        FakeSource(msgs),  # type: ignore[arg-type]
        applier,
        settings,
        dead_letters=dead,  # type: ignore[arg-type]
        router=router,
    )
    return consumer, dead, tiers


def found(tiers: Tiers, table: str, keys: list[int]) -> list[bool]:
    assert tiers.persistent is not None
    return tiers.persistent.fetch(table, np.array(keys))[1].tolist()


def test_messages_reach_the_versions_they_name(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    for n in (2, 3):
        registry.begin(config.model("demo"), n)
    registry.set_state("demo", 2, "ready")  # 3 stays loading
    msgs = [
        upsert([1], 0),  # untagged: live 1 and ready 2
        upsert([2], 1, tag=2),
        upsert([3], 2, tag=1),
        upsert([4], 3, tag=3),  # loading: not now
        upsert([5], 4, tag=9),  # unknown: dead letter
    ]
    consumer, dead, tiers = consumer_for(config, msgs)
    consumer.run_once(threading.Event())
    assert found(tiers, "demo.t0", [1, 2, 3, 4]) == [True, False, True, False]
    assert found(tiers, "demo.t0@2", [1, 2, 3, 4]) == [True, True, False, False]
    assert "demo.t0@3" not in consumer.applier.tables  # nothing went to it
    assert dead.sent == [(4, "UnknownTableError: model demo has no version 9")]
    assert consumer.source.stored == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]


def test_a_retired_version_takes_nothing(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "retired")
    consumer, dead, tiers = consumer_for(config, [upsert([1], 0, tag=2), upsert([2], 1)])
    consumer.run_once(threading.Event())
    assert dead.sent == [(0, "UnknownTableError: model demo version 2 is retired")]
    assert found(tiers, "demo.t0", [1, 2]) == [False, True]


def test_the_record_is_followed_between_polls(config: PSConfig) -> None:
    """A version activated while the loop runs takes the untagged stream from then on."""
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    consumer, _, tiers = consumer_for(config, [upsert([1], 0), upsert([2], 1)])
    settings = consumer.settings.model_copy(update={"max_batch_size": 1})
    consumer.settings = settings
    consumer.run_once(threading.Event())  # key 1: live 1 and ready 2
    time.sleep(0.01)  # a new modification time for the record
    registry.set_live("demo", 2)
    consumer.run_once(threading.Event())  # key 2: only live 2 (1 is below it)
    assert found(tiers, "demo.t0", [1, 2]) == [True, False]
    assert found(tiers, "demo.t0@2", [1, 2]) == [True, True]


def test_a_version_that_refuses_a_message_does_not_take_it_from_the_others(
    config: PSConfig,
) -> None:
    """A retrain with another dimension: an untagged update of the old dimension still
    reaches the live version; the message is dead-lettered for the version refusing it."""
    model = config.model("demo")
    wider = model.model_copy(
        update={"embedding_vecsize_per_table": [d * 2 for d in model.embedding_vecsize_per_table]}
    )
    registry = VersionRegistry(config)
    registry.begin(wider, 2)
    registry.set_state("demo", 2, "ready")
    consumer, dead, tiers = consumer_for(config, [upsert([1], 0), upsert([2], 1, tag=2)])
    consumer.run_once(threading.Event())
    assert found(tiers, "demo.t0", [1, 2]) == [True, False]
    assert "demo.t0@2" not in consumer.applier.tables  # nothing went to it
    assert [o for o, _ in dead.sent] == [0, 1]
    assert all(r.startswith("ShapeError: demo.t0@2: vectors of dim 4") for _, r in dead.sent)
    assert consumer.source.stored == [0, 1]  # type: ignore[attr-defined]


def test_a_batch_that_lands_after_its_version_was_retired_is_dropped_again(
    config: PSConfig,
) -> None:
    """A retire that drops a version while a batch routed to it is in flight (a tier without
    a writer lock): what the batch then writes there is dropped again, not left for ever."""
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    consumer, _, tiers = consumer_for(config, [upsert([1], 0)])  # untagged: versions 1 and 2
    apply = consumer.applier.apply
    v2 = config.model("demo").at_version(2).tables[0]

    def retired_first(*args: object, **kw: object) -> object:  # as `hps versions retire 2`
        registry.set_state("demo", 2, "retired", rows_left=True)
        tiers.drop_table(v2, reopen=False)
        registry.set_state("demo", 2, "retired")
        return apply(*args, **kw)  # type: ignore[arg-type]

    consumer.applier.apply = retired_first  # type: ignore[method-assign]
    consumer.run_once(threading.Event())
    assert found(tiers, "demo.t0", [1]) == [True]
    assert tiers.persistent is not None and tiers.volatile is not None
    for store in (tiers.persistent, tiers.volatile):
        with pytest.raises(UnknownTableError):
            store.size(v2.name)  # no rows, no table: nothing left for a later import to mix
    assert v2.name not in consumer.applier.tables

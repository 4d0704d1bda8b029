"""Online updates know their model version (docs/updates.md, "Model versions"): a real
broker (Tansu), a real RocksDB L3 with two versions recorded, ``hps consume``'s loop.

Each check waits for the rows a message must change; the rows it must not change are
checked once every message published before it has been handled (the same message, or a
later one in the same partitions)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from hps.build import build_session
from hps.config import PSConfig, parse_config
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import import_tables, sparse_sources
from hps.lookup import LookupSession
from hps.testing.kafka import TansuBroker
from hps.topology import topology
from hps.types import TableSpec
from hps.updates import Publisher
from hps.updates.consumer import UpdateConsumer
from hps.updates.embedded import start_background_applier
from hps.updates.runtime import build_service
from hps.versions import VersionRegistry
from hps.versions.rollout import import_version, version_entry
from tests.fixtures.kafka import running, update_doc, wait_for
from tests.helpers import rows

pytestmark = pytest.mark.integration

KEYS = np.arange(2000, dtype=np.int64)
A, B, C, D, E = (np.arange(i * 64, (i + 1) * 64, dtype=np.int64) for i in range(5))
FENCE = np.arange(1000, 2000, dtype=np.int64)  # 1000 keys: every partition of a topic
V1_SEED, V2_SEED = 0, 100


def sparse(tmp_path: Path, name: str, seed: int) -> list[str]:
    """Sparse files of both tables (t0: dim 4, t1: dim 8) for ``KEYS``."""
    out = []
    for table, dim in (("t0", 4), ("t1", 8)):
        folder = tmp_path / name / table
        write_sparse_model(folder, KEYS, rows(KEYS, dim, seed))
        out.append(str(folder))
    return out


def versioned_config(tmp_path: Path, brokers: str, **kw: Any) -> PSConfig:
    """One model on a RocksDB L3 whose version 1 (the ps.json's) is imported."""
    doc = update_doc(tmp_path, brokers, **kw)
    doc["models"][0]["sparse_files"] = sparse(tmp_path, "v1", V1_SEED)
    cfg = parse_config(doc, str(tmp_path / "ps.json"))
    import_tables(cfg, topology(cfg), sparse_sources(cfg))
    return cfg


def t0(cfg: PSConfig, version: int) -> TableSpec:
    return cfg.models[0].at_version(version).tables[0]


def stored(session: LookupSession, spec: TableSpec, keys: np.ndarray) -> np.ndarray:
    """L3's rows of ``keys`` (NaN where it has none)."""
    l3 = session.tiers.persistent
    assert l3 is not None
    l3.open_table(spec)
    values, found = l3.fetch(spec.name, keys)
    out = np.asarray(values, dtype=np.float32).copy()
    out[~found] = np.nan
    return out


def holds(session: LookupSession, spec: TableSpec, keys: np.ndarray, seed: int) -> bool:
    return np.array_equal(stored(session, spec, keys), rows(keys, 4, seed))


def sees(consumer: UpdateConsumer, model: str, version: int, state: str) -> bool:
    """Whether the loop has read the record with ``version`` in ``state``."""
    point = consumer.router.watch.points.get(model, {}).get(version)
    return point is not None and point.state == state


def dead_reasons(brokers: str, topic: str, n: int) -> list[str]:
    c = Consumer({"bootstrap.servers": brokers, "group.id": "dlq-versions"})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Any] = []

    def enough() -> bool:
        got.extend(c.consume(10, 0.2))
        return len(got) >= n

    try:
        wait_for(enough, 30, "dead letters")
    finally:
        c.close()
    return [dict(m.headers())["hps_reason"].decode() for m in got]


@pytest.fixture
def consumer_session(tmp_path: Path, kafka_broker: TansuBroker) -> Iterator[PSConfig]:
    yield versioned_config(tmp_path, kafka_broker.bootstrap, volatile={"type": "disabled"})


def test_each_message_reaches_the_versions_it_goes_to(
    tmp_path: Path, kafka_broker: TansuBroker, consumer_session: PSConfig
) -> None:
    cfg = consumer_session
    model, brokers = cfg.models[0].model, kafka_broker.bootstrap
    registry = VersionRegistry(cfg)
    entry = version_entry(cfg, model, sparse_files=sparse(tmp_path, "v2", V2_SEED))
    assert import_version(cfg, entry, 2)[f"{model}.t0@2"] == KEYS.size  # ready, not live
    v1, v2 = t0(cfg, 1), t0(cfg, 2)
    session = build_session(cfg, with_cache=False)
    try:
        with running(build_service(cfg, session)) as svc:
            # v1 live, v2 ready above it: tagged 2 -> v2 only; untagged -> both
            with Publisher(brokers, version=2) as tagged2:
                tagged2.publish(model, "t0", A, rows(A, 4, 2))
            wait_for(lambda: holds(session, v2, A, 2), 60, "tagged 2 in version 2")
            assert holds(session, v1, A, V1_SEED)
            with Publisher(brokers) as untagged:
                untagged.publish(model, "t0", B, rows(B, 4, 3))
            wait_for(lambda: holds(session, v1, B, 3) and holds(session, v2, B, 3), 30,
                     "untagged in the live version and the ready one above it")  # fmt: skip

            # v2 activated: untagged -> v2 only; tagged 1 -> v1 (kept for rollback) only
            registry.set_live(model, 2)
            wait_for(lambda: sees(svc, model, 2, "live"), 30, "the loop to read the record")
            with Publisher(brokers) as untagged:
                untagged.publish(model, "t0", C, rows(C, 4, 4))
            wait_for(lambda: holds(session, v2, C, 4), 30, "untagged in the live version 2")
            assert holds(session, v1, C, V1_SEED)
            with Publisher(brokers, version=1) as tagged1:
                tagged1.publish(model, "t0", D, rows(D, 4, 5))
            wait_for(lambda: holds(session, v1, D, 5), 30, "tagged 1 in version 1")
            assert holds(session, v2, D, V2_SEED)

            # an unknown and a retired version: dead letters with the reason, and on it goes
            registry.begin(cfg.models[0], 3)
            registry.set_state(model, 3, "retired")
            wait_for(lambda: sees(svc, model, 3, "retired"), 30, "the loop to read the record")
            for n in (9, 3):
                with Publisher(brokers, version=n) as pub:
                    pub.publish(model, "t0", E, rows(E, 4, 6))
            with Publisher(brokers) as untagged:
                untagged.publish(model, "t0", E, rows(E, 4, 7))
            wait_for(lambda: holds(session, v2, E, 7), 30, "the untagged update after them")
            assert holds(session, v1, E, V1_SEED)
        reasons = set(dead_reasons(brokers, cfg.update_source.hps_dead_letter_topic, 2))
        assert f"UnknownTableError: model {model} has no version 9" in reasons
        assert f"UnknownTableError: model {model} version 3 is retired" in reasons
    finally:
        session.close()


def publish_while_loading(brokers: str, model: str) -> None:
    """Tagged 2 on A, then untagged on FENCE (every partition): once the fence is applied
    to the live version, the tagged messages before it have been handled too."""
    with Publisher(brokers, version=2) as tagged2:
        tagged2.publish(model, "t0", A, rows(A, 4, 8))
    with Publisher(brokers) as untagged:
        untagged.publish(model, "t0", FENCE, rows(FENCE, 4, 9))


def replayed(svc: UpdateConsumer) -> bool:
    """The consumer's replay has finished (its rows land before it has read to its end)."""
    return svc.catchup is not None and not svc.catchup.due


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
def test_updates_published_while_a_version_loads_are_replayed_to_it(
    tmp_path: Path, kafka_broker: TansuBroker, consumer_session: PSConfig, restart: bool
) -> None:
    """The rollout rule; ``restarted``: the consumer stops while version 2 loads and finds
    it ready when it starts again."""
    cfg = consumer_session
    model, brokers = cfg.models[0].model, kafka_broker.bootstrap
    registry = VersionRegistry(cfg)
    v1, v2 = t0(cfg, 1), t0(cfg, 2)
    session = build_session(cfg, with_cache=False)
    try:
        with running(build_service(cfg, session)) as svc:
            registry.begin(cfg.models[0], 2)  # what import_version records first
            stored(session, v2, A)  # its (empty) table, as the import would create it
            wait_for(lambda: sees(svc, model, 2, "loading"), 30, "the loop to see it loading")
            publish_while_loading(brokers, model)
            wait_for(lambda: holds(session, v1, FENCE, 9), 60, "untagged in the live version")
            assert holds(session, v1, A, V1_SEED)  # tagged 2 is not version 1's
            assert np.isnan(stored(session, v2, np.concatenate([A, FENCE]))).all()
            if not restart:
                registry.set_state(model, 2, "ready")
                wait_for(lambda: holds(session, v2, A, 8) and holds(session, v2, FENCE, 9)
                         and replayed(svc), 60, "the replay to version 2")  # fmt: skip
        if restart:
            registry.set_state(model, 2, "ready")
            with running(build_service(cfg, session)) as svc:
                wait_for(lambda: holds(session, v2, A, 8) and holds(session, v2, FENCE, 9)
                         and replayed(svc), 60,
                         "the replay to version 2 after the restart")  # fmt: skip
        assert svc.catchup is not None and svc.catchup.replayed >= 2  # A's and the fence's
        assert not svc.catchup.due
        assert holds(session, v1, A, V1_SEED)
    finally:
        session.close()


def test_a_serving_instance_applies_what_goes_to_its_own_version(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    """Embedded mode: the instance of version 2 (here the live one) applies untagged and
    2-tagged updates, not those tagged for version 1."""
    brokers = kafka_broker.bootstrap
    cfg = versioned_config(tmp_path, brokers)  # hash_map L2 in the process: embedded
    model = cfg.models[0].model
    registry = VersionRegistry(cfg)
    import_version(cfg, version_entry(cfg, model, sparse_files=sparse(tmp_path, "v2", V2_SEED)), 2)
    registry.set_live(model, 2)
    at2 = registry.config_at(model, 2)
    session = build_session(at2)
    table = f"{model}.t0@2"
    handle = start_background_applier(session, at2)
    try:
        with Publisher(brokers, version=1) as tagged1:
            tagged1.publish(model, "t0", A, rows(A, 4, 11))
        with Publisher(brokers) as untagged:
            untagged.publish(model, "t0", FENCE, rows(FENCE, 4, 12))
        wait_for(lambda: np.array_equal(session.lookup(table, FENCE), rows(FENCE, 4, 12)), 60,
                 "untagged in this instance's version")  # fmt: skip
        np.testing.assert_array_equal(session.lookup(table, A), rows(A, 4, V2_SEED))
        with Publisher(brokers, version=2) as tagged2:
            tagged2.publish(model, "t0", A, rows(A, 4, 13))
        wait_for(lambda: np.array_equal(session.lookup(table, A), rows(A, 4, 13)), 30,
                 "tagged 2 in this instance's version")  # fmt: skip
    finally:
        handle.stop()
        session.close()
    assert handle.error is None


def test_publish_cli_tags_its_messages(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    from hps.cli import main
    from hps.updates import codec

    keys = np.arange(10, dtype=np.int64)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", rows(keys, 4, 1))
    model = f"cli{uuid.uuid4().hex[:8]}"
    argv = ["publish", "--brokers", kafka_broker.bootstrap, "--table", f"{model}.t0",
            "--npy", str(tmp_path / "k.npy"), str(tmp_path / "v.npy"), "--quiet",
            "--partitions", "1", "--model-version", "2"]  # fmt: skip
    assert main(argv) == 0
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "cli-tag"})
    c.assign([TopicPartition(codec.topic_name(model, "t0"), 0, OFFSET_BEGINNING)])
    got: list[Any] = []

    def received() -> bool:
        got.extend(m for m in c.consume(10, 0.2) if m.error() is None)
        return bool(got)

    try:
        wait_for(received, 30, "the published message")
    finally:
        c.close()
    d = codec.decode(got[0].value())
    assert d.model_version == 2 and d.keys.tolist() == keys.tolist()

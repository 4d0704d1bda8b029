"""Update integrity under a hostile producer, on a real broker (Tansu), RocksDB and Redis
(docs/updates.md "Version bound" and "Applying: order, idempotence, durability"):

- a version or timestamp from the future is dead-lettered, never applied, and an honest
  update afterwards applies;
- ``hps repair-versions`` unpins keys that such a message pinned before the bound existed;
- an older update never replaces a newer one that came through another partition (unkeyed
  HugeCTR messages; a partition-count change).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from hps.build import build_session
from hps.config import load_config
from hps.net import free_port
from hps.storage.rocks_db import RocksDBStore
from hps.testing.kafka import TansuBroker
from hps.tiers.rows import RowStore
from hps.tiers.versions import key_versions
from hps.types import TableSpec
from hps.updates import Publisher, codec
from hps.updates.kafka import ensure_topics
from hps.updates.partition import partition_of
from hps.updates.runtime import build_service
from hps.versions import VersionRegistry
from tests.fixtures.kafka import running, update_doc, wait_for
from tests.helpers import rows

pytestmark = pytest.mark.integration

YEAR_NS = 365 * 86400 * 10**9
KEYS = np.arange(2000, 2050, dtype=np.int64)  # 50 keys


def write_config(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(doc))
    return path


def produce(brokers: str, topic: str, payload: bytes, partition: int, ts_ns: int) -> None:
    """One message with a timestamp of our choosing (CreateTime), as a forger would send."""
    p = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    p.produce(topic, payload, partition=partition, timestamp=ts_ns // 1_000_000)
    assert p.flush(30) == 0


def read_dead_letters(brokers: str, topic: str, n: int) -> list[Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": brokers, "group.id": "dlq-read", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[Any] = []
    try:
        wait_for(lambda: out.extend(c.consume(10, 0.2)) or len(out) >= n, 60, f"{n} dead letters")
    finally:
        c.close()
    return out


def test_versions_and_timestamps_from_the_future_are_dead_lettered_not_applied(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    """A native message whose version and CreateTime lie 50 years ahead, and a HugeCTR one
    whose timestamp (its version) does: both go to the dead-letter topic; the honest
    updates published after them apply."""
    brokers = kafka_broker.bootstrap
    doc = update_doc(tmp_path, brokers)
    cfg = load_config(write_config(tmp_path, doc))
    model = cfg.models[0].model
    t0, t1 = codec.topic_name(model, "t0"), codec.topic_name(model, "t1")
    far = time.time_ns() + 50 * YEAR_NS
    session = build_session(cfg, with_cache=False)
    try:
        with running(build_service(cfg, session)) as svc:
            produce(brokers, t0, codec.encode(KEYS, rows(KEYS, 4, seed=9), far), 0, far)
            produce(brokers, t1, codec.encode_hugectr(KEYS, rows(KEYS, 8, seed=9)), 1, far)
            with Publisher(brokers) as pub:
                pub.publish(model, "t0", KEYS, rows(KEYS, 4, seed=1))
                topic_t1 = codec.topic_name(model, "t1")
                pub.produce_raw(topic_t1, codec.encode_hugectr(KEYS, rows(KEYS, 8, seed=2)), 3)
            wait_for(lambda: svc.rows_applied >= 2 * KEYS.size, 60, "the honest rows applied")
            letters = read_dead_letters(brokers, cfg.update_source.hps_dead_letter_topic, 2)
        assert sorted(dict(m.headers())["hps_topic"].decode() for m in letters) == [t0, t1]
        for letter in letters:
            reason = dict(letter.headers())["hps_reason"].decode()
            assert reason.startswith("VersionError: update version"), reason
            assert "consumer's clock at receipt" in reason
        np.testing.assert_array_equal(session.lookup(f"{model}.t0", KEYS), rows(KEYS, 4, seed=1))
        np.testing.assert_array_equal(session.lookup(f"{model}.t1", KEYS), rows(KEYS, 8, seed=2))
        assert session.tiers.persistent is not None
        assert session.tiers.persistent.size(f"{model}.t0") == KEYS.size
    finally:
        session.close()


def test_update_topics_are_created_with_log_append_time(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    """The broker stamps the messages of the update topics hps creates; the dead-letter
    topic keeps the broker's default."""
    topic = codec.topic_name(f"m{os.getpid()}x{time.monotonic_ns()}", "t")
    dead = f"dead.{topic}"
    ensure_topics(kafka_broker.bootstrap, [topic, dead], num_partitions=2)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    got = {}
    for name in (topic, dead):
        (fut,) = admin.describe_configs([ConfigResource("topic", name)]).values()
        entry = fut.result().get("message.timestamp.type")
        got[name] = None if entry is None else entry.value
    assert got[topic] == "LogAppendTime"
    assert got[dead] != "LogAppendTime"


def pinned_database(path: Path, spec: TableSpec, version: int) -> None:
    """An L3 as a consumer without the bound left it: KEYS applied at ``version``."""
    store = RocksDBStore(str(path))
    try:
        tier = RowStore(store, "L3")
        tier.open_table(spec)
        versions = key_versions(tier, spec)
        stale = np.full(KEYS.size, version, dtype=np.uint64)
        versions.upsert(KEYS, rows(KEYS, spec.dim, seed=9), stale, durable=True)
    finally:
        store.close()


def hps_command(*args: str) -> subprocess.CompletedProcess[str]:
    hps = Path(sys.executable).with_name("hps")
    return subprocess.run([str(hps), *args], capture_output=True, text=True, timeout=120)


def test_repair_versions_unpins_keys_of_an_old_database(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    doc = update_doc(tmp_path, kafka_broker.bootstrap)
    config = write_config(tmp_path, doc)
    cfg = load_config(config)
    model = cfg.models[0].model
    spec = next(t for t in cfg.tables if t.name == f"{model}.t0")
    pinned_database(Path(doc["persistent_db"]["path"]), spec, 2**64 - 1)

    done = hps_command("repair-versions", "--config", str(config), "--table", spec.name)
    assert done.returncode == 0, done.stderr
    assert f"{spec.name}: reset {KEYS.size} keys" in done.stdout
    assert "WARNING" not in done.stderr  # the in-process L2 is not opened: nothing to say
    again = hps_command("repair-versions", "--config", str(config), "--table", spec.name)
    assert again.returncode == 0 and "reset 0 keys" in again.stdout, again.stderr
    unknown = hps_command("repair-versions", "--config", str(config), "--table", "no.such")
    assert unknown.returncode != 0 and "no.such" in unknown.stderr

    for other in cfg.models[0].tables[1:]:  # version 1 held whole, as its record says
        pinned_database(Path(doc["persistent_db"]["path"]), other, 0)
    registry = VersionRegistry(cfg)  # version 2, ready beside live 1: its own namespace
    registry.begin(cfg.models[0], 2)
    registry.set_state(model, 2, "ready")
    at_2 = cfg.models[0].at_version(2).tables[0]
    pinned_database(Path(doc["persistent_db"]["path"]), at_2, 2**64 - 1)
    args = ("repair-versions", "--config", str(config), "--table", spec.name)
    done = hps_command(*args, "--model-version", "2")
    assert done.returncode == 0 and f"{at_2.name}: reset {KEYS.size} keys" in done.stdout
    assert "has no version 3" in hps_command(*args, "--model-version", "3").stderr

    session = build_session(cfg, with_cache=False)
    try:
        with running(build_service(cfg, session)) as svc:
            with Publisher(kafka_broker.bootstrap) as pub:
                pub.publish(model, "t0", KEYS, rows(KEYS, 4, seed=1))
            wait_for(lambda: svc.rows_applied >= KEYS.size, 60, "the honest rows applied")
        np.testing.assert_array_equal(session.lookup(spec.name, KEYS), rows(KEYS, 4, seed=1))
    finally:
        session.close()


class ConsumeProcess:
    """``hps consume`` as a process, with its metrics port to watch it."""

    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port()
        hps = Path(sys.executable).with_name("hps")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(hps), "consume", "--config", str(config), "--metrics-port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def total(self, name: str) -> float:
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=1) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        lines = (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith(name + "{"))
        return sum(float(value) for _, value in lines)

    def handled(self) -> float:
        applied = self.total("hps_updates_applied_rows_total")
        return applied + self.total("hps_updates_stale_rows_total")

    def stop(self) -> int:
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(60)


def test_an_older_unkeyed_update_on_another_partition_never_replaces_a_newer_one(
    tmp_path: Path, kafka_broker: TansuBroker, redis_address: str
) -> None:
    """``hps consume`` over Redis L2 + RocksDB L3: HugeCTR messages (no Kafka key) for 50
    keys, one 60 s newer on partition 0, then one 1 s old on partition 1: the newer rows
    stay in both tiers."""
    brokers = kafka_broker.bootstrap
    doc = update_doc(
        tmp_path, brokers, volatile={"type": "redis", "address": redis_address, "num_partitions": 2}
    )
    config = write_config(tmp_path, doc)
    cfg = load_config(config)
    model = cfg.models[0].model
    topic = codec.topic_name(model, "t0")
    ensure_topics(brokers, [topic], num_partitions=8)
    consume = ConsumeProcess(config, tmp_path / "consume.log")
    try:
        now = time.time_ns()
        produce(
            brokers, topic, codec.encode_hugectr(KEYS, rows(KEYS, 4, seed=1)), 0, now + 60 * 10**9
        )
        wait_for(lambda: consume.handled() >= KEYS.size, 90, "the newer rows handled")
        produce(brokers, topic, codec.encode_hugectr(KEYS, rows(KEYS, 4, seed=2)), 1, now - 10**9)
        wait_for(lambda: consume.handled() >= 2 * KEYS.size, 60, "the older rows handled")
        assert consume.total("hps_updates_stale_rows_total") == KEYS.size
    finally:
        assert consume.stop() == 0
    session = build_session(cfg, with_cache=False)
    try:
        tiers = session.tiers
        assert tiers.volatile is not None and tiers.persistent is not None
        for tier in (tiers.volatile, tiers.persistent):
            values, found = tier.fetch(f"{model}.t0", KEYS)
            assert found.all(), tier
            np.testing.assert_array_equal(values, rows(KEYS, 4, seed=1))
    finally:
        session.close()


def stale_rows(table: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("hps_updates_stale_rows_total", {"table": table}) or 0.0


def test_a_partition_count_change_keeps_order(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    """Keys that moved partitions when a topic grew from 2 to 8: their newer updates (in the
    new partitions) are read before the older ones left in the old partitions, which then
    change nothing."""
    brokers = kafka_broker.bootstrap
    cfg = load_config(write_config(tmp_path, update_doc(tmp_path, brokers)))
    model = cfg.models[0].model
    table, topic = f"{model}.t0", codec.topic_name(model, "t0")
    ensure_topics(brokers, [topic], num_partitions=8)
    cand = np.arange(3000, 3400, dtype=np.int64)
    keys = cand[partition_of(cand, 8) >= 2][:50]  # in partitions the old count did not have
    now = time.time_ns()
    session = build_session(cfg, with_cache=False)
    try:
        with running(build_service(cfg, session)) as svc:
            for step, (count, seed, version) in enumerate(((8, 1, now), (2, 2, now - 10**9))):
                parts = partition_of(keys, count)
                for part in np.unique(parts):
                    group = keys[parts == part]
                    payload = codec.encode(group, rows(group, 4, seed=seed), version)
                    produce(brokers, topic, payload, int(part), now)
                want = (step + 1) * keys.size
                wait_for(
                    lambda want=want: svc.rows_applied + stale_rows(table) >= want,
                    60,
                    f"the rows published over {count} partitions handled",
                )
        assert stale_rows(table) == keys.size
        np.testing.assert_array_equal(session.lookup(table, keys), rows(keys, 4, seed=1))
    finally:
        session.close()

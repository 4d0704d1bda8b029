"""``hps consume`` SIGKILLed at 20 random points of a running stream (Redis L2 + RocksDB L3).

After every kill: each message below the group's committed offsets is applied in L2 and L3
(its sentinel key is there), so commits never run ahead of applies. After the last restart
drains the stream: L2 and L3 hold exactly the state the stream describes.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from hps.config import VolatileDBConfig
from hps.net import free_port
from hps.storage.redis_cluster import RedisStore
from hps.storage.rocks_db import RocksDBStore
from hps.testing.kafka import TansuBroker
from hps.types import TableSpec
from hps.updates import Publisher, codec
from tests.fixtures.kafka import update_doc, wait_for
from tests.integration.faults.consume_stream import (
    DIM,
    PARTITIONS,
    SENTINELS,
    Launcher,
    TopicReader,
    applied_rows,
    committed,
    expected,
    sentinels_of,
    step,
)

pytestmark = pytest.mark.integration

KILLS = 20


def _stores(doc: dict, spec: TableSpec) -> tuple[RocksDBStore, RedisStore]:
    l3 = RocksDBStore(doc["persistent_db"]["path"], mode="read_only")
    l2 = RedisStore.from_config(VolatileDBConfig(**doc["volatile_db"]))
    for s in (l3, l2):
        s.open_table(spec)
    return l3, l2


def test_twenty_sigkills_commit_nothing_unapplied_and_end_exact(
    tmp_path: Path, kafka_broker: TansuBroker, redis_address: str
) -> None:
    brokers = kafka_broker.bootstrap
    doc = update_doc(tmp_path, brokers, max_batch_size=40, max_commit_interval=2)
    # a SIGKILLed member holds its partitions until its session times out
    doc["update_source"]["hps_kafka_config"] = {
        "session.timeout.ms": 1000,
        "heartbeat.interval.ms": 200,
    }
    doc["volatile_db"] = {"type": "redis", "address": redis_address, "hps_socket_timeout_s": 2.0}
    model = doc["models"][0]["model"]
    group = doc["update_source"]["hps_group_id"] = f"g-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "ps.json"
    config.write_text(json.dumps(doc))
    spec = TableSpec(model, "t0", DIM)
    topic = codec.topic_name(model, "t0")
    log = tmp_path / "consume.log"
    l3 = RocksDBStore(doc["persistent_db"]["path"])  # exists even if the first kill is early
    l3.open_table(spec)
    l3.close()
    stream: list = []
    pub = Publisher(brokers, num_partitions=PARTITIONS)
    done = threading.Event()

    def produce() -> None:
        rng = np.random.default_rng(5)
        i = 0
        while not done.is_set() and i < SENTINELS.shape[1]:
            for kind, keys, vals in step(rng, i):
                if kind == "delete":
                    pub.delete(model, "t0", keys)
                else:
                    pub.publish(model, "t0", keys, vals)
                stream.append((kind, keys, vals))
            pub.flush()
            i += 1
            time.sleep(0.05)

    producer = threading.Thread(target=produce)
    producer.start()
    rng = np.random.default_rng(17)
    checked = []
    launcher = Launcher()
    reader = TopicReader(brokers, topic)
    try:
        for _ in range(KILLS):
            port = free_port()
            pid = launcher.consume(config, log, "--metrics-port", str(port))
            wait_for(lambda p=port: applied_rows(p) > 0, 60, f"the consumer to apply ({log})")
            time.sleep(rng.uniform(0.0, 1.0))  # a random point of the running stream
            assert launcher.stop(pid, signal.SIGKILL) == -signal.SIGKILL
            below = committed(brokers, group, topic)
            sent = sentinels_of(reader.below(below))
            l3, l2 = _stores(doc, spec)
            try:
                for store in (l3, l2):
                    missing = ~store.fetch(spec.name, sent)[1]
                    assert not missing.any(), (
                        f"{store.name}: {int(missing.sum())} messages below the committed "
                        f"offsets {below} were not applied"
                    )
            finally:
                l3.close()
                l2.close()
            checked.append(sent.size)
    finally:
        done.set()
        producer.join(30)
        pub.close()
    last = launcher.consume(config, log)
    want = expected(stream)
    final_sentinels = np.array([k for k in want if k >= SENTINELS.min()], np.int64)

    def drained() -> bool:
        l2 = RedisStore.from_config(VolatileDBConfig(**doc["volatile_db"]))
        l2.open_table(spec)
        try:
            return bool(l2.fetch(spec.name, final_sentinels)[1].all())
        finally:
            l2.close()

    wait_for(drained, 60, f"the last consumer to drain the stream ({log})")
    assert launcher.stop(last) == 0
    launcher.close()
    reader.all()
    reader.close()
    assert committed(brokers, group, topic) == reader.ends  # everything, and no further
    keys = np.array(sorted(want), dtype=np.int64)
    rows = np.stack([want[k] for k in keys.tolist()])
    l3, l2 = _stores(doc, spec)
    try:
        for store in (l3, l2):
            values, found = store.fetch(spec.name, keys)
            assert found.all(), store.name
            np.testing.assert_array_equal(values, rows)
            assert store.size(spec.name) == len(want), store.name  # deleted keys are gone
    finally:
        l3.close()
        l2.close()
    print(
        f"\n{KILLS} SIGKILLs of hps consume during {len(stream)} publishes; messages verified "
        f"below the committed offsets after each kill: {checked}; final L2 and L3 exact "
        f"({len(want)} keys)"
    )

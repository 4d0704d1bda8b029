"""Publisher.prepare: every table's topic and metadata before the first publish (real Tansu)."""

from __future__ import annotations

import uuid

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from hps.testing.kafka import TansuBroker
from hps.updates import Publisher, codec


def test_prepare_creates_every_table_topic_and_publishes_to_them(
    kafka_broker: TansuBroker,
) -> None:
    model = f"prep{uuid.uuid4().hex[:8]}"
    tables = ["a", "b", "c"]
    with Publisher(kafka_broker.bootstrap, num_partitions=2) as pub:
        pub.prepare(model, tables)
        meta = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=10)
        for t in tables:
            topic = meta.topics[codec.topic_name(model, t)]
            assert len(topic.partitions) == 2
        pub.prepare(model, tables)  # again: nothing to do, no error
        pub.publish(model, "b", np.array([4, 5], dtype=np.int64), np.ones((2, 3), np.float32))
        pub.flush(timeout_s=10)

    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": model})
    try:
        topic = codec.topic_name(model, "b")
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
        keys: list[int] = []
        for _ in range(50):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                keys += codec.decode(msg.value()).keys.tolist()
            if len(keys) == 2:
                break
        assert sorted(keys) == [4, 5]
    finally:
        consumer.close()

"""A replay or tail source reads partitions added to its topics after it started, from
their beginning (real broker: Tansu cannot add partitions, so the source is made to
believe at its start that the topic had one partition fewer than it has)."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from hps.testing.kafka import TansuBroker
from hps.updates import Publisher, codec
from hps.updates import source as source_mod
from hps.updates.source import MessageSource

HANG_S = 60.0  # hang guard only


def test_a_partition_added_later_is_read_from_its_beginning(
    kafka_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = f"grow{uuid.uuid4().hex[:8]}"
    topic = codec.topic_name(model, "t")
    with Publisher(kafka_broker.bootstrap, num_partitions=2) as pub:
        pub.publish(model, "t", np.arange(64), np.ones((64, 2), np.float32))
        pub.flush(timeout_s=10)
    group = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": model})
    try:  # the service's group has applied partition 0 to its end
        _, end = group.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        group.commit(offsets=[TopicPartition(topic, 0, end)], asynchronous=False)
    finally:
        group.close()
    monkeypatch.setattr(source_mod, "ensure_topics", lambda *a, **k: {topic: 1})
    source = MessageSource(kafka_broker.bootstrap, [topic], mode="tail", group_id=model,
                           config={"topic.metadata.refresh.interval.ms": 100})  # fmt: skip
    try:
        assert source.assignment == [(topic, 0)]  # as it was at the start
        got: list[int] = []
        deadline = time.monotonic() + HANG_S
        while not got:
            assert time.monotonic() < deadline, "nothing read of the added partition"
            msg = source.poll(0.2)
            if msg is not None:
                got.append(int(msg.partition() or 0))
        assert got == [1]  # partition 0 is tailed from where the group is (its end); the
        # added partition is read from its beginning
        assert source.assignment == [(topic, 0), (topic, 1)]
    finally:
        source.close()

"""MessageSource.rewind against a real broker (Tansu): messages taken but not applied are
read again, from the first of them, in order, and nothing twice."""

from __future__ import annotations

import time
import uuid

import numpy as np
from confluent_kafka import Message

from hps.testing.kafka import TansuBroker
from hps.updates import Publisher, codec
from hps.updates.source import MessageSource, position

HANG_S = 60.0  # hang guard only


def _take(source: MessageSource, n: int) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + HANG_S
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} messages"
        msg = source.poll(0.2)
        if msg is not None:
            got += [msg, *source.drain(n - len(got) - 1)]
    return got


def test_a_rewind_reads_the_messages_again_from_the_first_of_them(
    kafka_broker: TansuBroker,
) -> None:
    model = f"rew{uuid.uuid4().hex[:8]}"
    topic = codec.topic_name(model, "t")
    with Publisher(kafka_broker.bootstrap, num_partitions=1) as pub:
        for key in range(5):
            pub.publish(model, "t", np.array([key]), np.ones((1, 2), np.float32))
            pub.flush(timeout_s=10)  # one message each
    source = MessageSource(
        kafka_broker.bootstrap, [topic], mode="replay", group_id=model, num_partitions=1
    )
    try:
        msgs = _take(source, 5)
        assert [int(codec.decode(m.value()).keys[0]) for m in msgs] == [0, 1, 2, 3, 4]
        source.rewind(msgs[2:])  # the last three were taken but not applied
        again = _take(source, 3)
        assert [position(m) for m in again] == [position(m) for m in msgs[2:]]
        assert source.poll(0.5) is None  # nothing more, nothing twice
    finally:
        source.close()

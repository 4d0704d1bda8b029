"""MessageSource in group mode against a real broker (Tansu): the partitions it holds are
the driver's (an incremental rebalance hands callbacks only the change), and a consumer
whose batch outlived ``max.poll.interval.ms`` rejoins instead of dying in the callback."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

import numpy as np

from hps.config import UpdateSourceConfig, parse_config
from hps.errors import BackendUnavailable
from hps.testing.kafka import TansuBroker
from hps.types import TableSpec, UpdateBatch
from hps.updates import Publisher, codec
from hps.updates.applier import Applied
from hps.updates.consumer import UpdateConsumer
from hps.updates.source import MessageSource

HANG_S = 60.0  # hang guards only
FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 300}


def _poll_until(sources: Sequence[MessageSource], done: object, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        for s in sources:
            s.poll(0.1)


def test_cooperative_rebalances_keep_the_partitions_held(kafka_broker: TansuBroker) -> None:
    model = f"coop{uuid.uuid4().hex[:8]}"
    topic = codec.topic_name(model, "t")
    conf = {**FAST_GROUP, "partition.assignment.strategy": "cooperative-sticky"}

    def source() -> MessageSource:
        return MessageSource(kafka_broker.bootstrap, [topic], mode="group", group_id=model,
                             config=conf, num_partitions=4)  # fmt: skip

    a = source()
    try:
        _poll_until([a], lambda: len(a.assignment) == 4, "the first member holds all four")
        b = source()
        try:
            _poll_until([a, b], lambda: len(a.assignment) + len(b.assignment) == 4
                        and len(b.assignment) > 0, "the second member takes a share")  # fmt: skip
            held = {p for _, p in a.assignment} | {p for _, p in b.assignment}
            assert held == {0, 1, 2, 3}
            assert len(a.assignment) < 4  # the kept partitions are still known as held
            assert set(a.positions()) <= set(a.assignment)
        finally:
            b.close()
    finally:
        a.close()


class _DownThenUp:
    """An applier whose tiers are down for ``down_s`` (longer than the poll interval)."""

    def __init__(self, spec: TableSpec, down_s: float) -> None:
        self.tables = {spec.name: spec}
        self.up_at = time.monotonic() + down_s
        self.rows = 0

    def accept(self, spec: TableSpec) -> bool:
        return True

    def apply(self, batches: Sequence[UpdateBatch], served: object = None) -> list[Applied]:
        if time.monotonic() < self.up_at:
            raise BackendUnavailable("the tier is down")
        self.rows += sum(b.keys.size for b in batches)
        return []


def test_a_batch_that_outlives_the_poll_interval_does_not_end_the_consumer(
    kafka_broker: TansuBroker,
) -> None:
    model = f"lost{uuid.uuid4().hex[:8]}"
    cfg = parse_config({"models": [{"model": model, "embedding_table_names": ["t"],
                                    "embedding_vecsize_per_table": [2]}]}, "ps.json")  # fmt: skip
    conf = {**FAST_GROUP, "max.poll.interval.ms": 2500}
    source = MessageSource(kafka_broker.bootstrap, [codec.topic_name(model, "t")], mode="group",
                           group_id=model, config=conf, num_partitions=1)  # fmt: skip
    applier = _DownThenUp(cfg.tables[0], down_s=5.0)
    settings = UpdateSourceConfig(type="kafka_message_queue", brokers=kafka_broker.bootstrap,
                                  poll_timeout_ms=200, failure_backoff_ms=500)  # fmt: skip
    consumer = UpdateConsumer(source, applier, settings, router=None)  # type: ignore[arg-type]
    with Publisher(kafka_broker.bootstrap, num_partitions=1) as pub:
        pub.publish(model, "t", np.arange(4), np.ones((4, 2), np.float32))
    stop, errors = threading.Event(), list[BaseException]()

    def run() -> None:
        try:
            consumer.run(stop)
        except BaseException as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + HANG_S
    while applier.rows < 4 and not errors:
        assert time.monotonic() < deadline, "the batch was never applied"
        time.sleep(0.1)
    stop.set()
    thread.join(HANG_S)
    consumer.close()
    assert errors == []
    assert applier.rows >= 4


def _publish_one_by_one(brokers: str, topic: str, partitions: int, each: int) -> None:
    """``each`` messages to every partition, each delivered before the next is sent (one
    record batch each: Tansu's high watermark lags within a batch)."""
    model, table = codec.parse_topic(topic)
    with Publisher(brokers, num_partitions=partitions) as pub:
        pub.prepare(model, [table])  # creates the topic with ``partitions``
        for partition in range(partitions):
            for i in range(each):
                keys = np.array([i], dtype=np.int64)
                pub.produce_raw(topic, codec.encode(keys, np.ones((1, 2), np.float32), 1),
                                partition)  # fmt: skip
                pub.flush()


def test_a_partition_nothing_was_read_of_counts_its_lag_from_where_reading_starts(
    kafka_broker: TansuBroker,
) -> None:
    """A held partition whose position is unknown (nothing consumed of it yet: -1001) had
    no lag at all: a consumer catching up exported none for the partitions it had not
    reached. It counts from the group's committed offset, else the low watermark."""
    from confluent_kafka import Consumer, TopicPartition

    model = f"lagfrom{uuid.uuid4().hex[:8]}"
    topic = codec.topic_name(model, "t")
    _publish_one_by_one(kafka_broker.bootstrap, topic, partitions=2, each=3)

    replay = MessageSource(kafka_broker.bootstrap, [topic], mode="replay", group_id=model,
                           config=FAST_GROUP, num_partitions=2)  # fmt: skip
    try:  # nothing polled: no position anywhere; reading starts at the low watermark
        lag = _lag_of(replay, {(topic, 0), (topic, 1)})
        assert lag == {(topic, 0): 3, (topic, 1): 3}
    finally:
        replay.close()

    committer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": model,
                          "enable.auto.commit": False})  # fmt: skip
    committer.commit(offsets=[TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 1)],
                     asynchronous=False)  # fmt: skip
    committer.close()
    group = MessageSource(kafka_broker.bootstrap, [topic], mode="group", group_id=model,
                          config=FAST_GROUP, num_partitions=2)  # fmt: skip
    try:
        deadline = time.monotonic() + HANG_S
        first = group.poll(0.2)
        while first is None:
            assert time.monotonic() < deadline, "nothing consumed"
            first = group.poll(0.2)
        read, other = first.partition(), 1 - (first.partition() or 0)
        lag = _lag_of(group, {(topic, 0), (topic, 1)})
        assert lag[(topic, read)] == 3 - (first.offset() + 1)  # from its position
        assert lag[(topic, other)] == 2  # from the committed offset 1
    finally:
        group.close()


def _lag_of(source: MessageSource, want: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The source's lag once it covers ``want`` (the high watermarks come with fetches)."""
    deadline = time.monotonic() + 10.0
    while True:
        lag = source.lag()
        if set(lag) >= want or time.monotonic() > deadline:
            return lag
        time.sleep(0.1)


def test_a_rebalance_removes_the_lag_series_of_the_partitions_it_takes(
    kafka_broker: TansuBroker,
) -> None:
    """A partition revoked from a consumer kept its last lag in that consumer's /metrics
    for ever, besides its new owner's: the sum over the group never fell to 0."""
    from prometheus_client import REGISTRY

    from hps.updates import metrics

    model = f"lagrev{uuid.uuid4().hex[:8]}"
    topic = codec.topic_name(model, "t")

    def source() -> MessageSource:
        return MessageSource(kafka_broker.bootstrap, [topic], mode="group", group_id=model,
                             config=FAST_GROUP, num_partitions=4)  # fmt: skip

    def exported() -> set[int]:
        labels = [{"topic": topic, "partition": str(p)} for p in range(4)]
        found = [REGISTRY.get_sample_value("hps_updates_consumer_lag", x) for x in labels]
        return {p for p, value in enumerate(found) if value is not None}

    a = source()
    try:
        _poll_until([a], lambda: len(a.assignment) == 4, "the first member holds all four")
        for _, p in a.assignment:  # what a's loop exports
            metrics.CONSUMER_LAG.labels(topic, str(p)).set(100)
        b = source()
        try:
            _poll_until([a, b], lambda: len(b.assignment) > 0
                        and len(a.assignment) + len(b.assignment) == 4,
                        "the second member takes a share")  # fmt: skip
            taken = {p for _, p in b.assignment}
            assert not exported() & taken  # a's series of b's partitions are gone
        finally:
            b.close()
    finally:
        a.close()

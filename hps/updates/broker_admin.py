"""One Kafka admin client kept for the life of a process that asks the broker often.

The control plane reports each table's consumer lag and checks the broker for ``/readyz``;
a new admin client for each question started librdkafka's threads, connected and fetched
the cluster's metadata every time (4-10 ms of CPU and about 60 ms per call against Tansu on
this machine), for each report. :class:`BrokerAdmin` makes one, on first use, and keeps it:
librdkafka reconnects it when the broker comes back, and it is safe to share between
threads. Its log lines go to :data:`hps.updates.kafka.DRIVER_LOG`, served after each
question; driver errors are translated by :func:`hps.updates.kafka.translated`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from hps.updates.kafka import Setting, admin_conf, translated, with_driver_log

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient, OffsetSpec


class BrokerAdmin:
    """The broker's metadata and a consumer group's lag, through one admin client."""

    def __init__(self, brokers: str, config: Mapping[str, Setting] | None = None) -> None:
        self._conf = with_driver_log(admin_conf(brokers, config))
        self._client: AdminClient | None = None
        self._lock = threading.Lock()

    @contextmanager
    def _admin(self, what: str) -> Iterator[AdminClient]:
        """The client (made on first use), its errors translated as ``what``."""
        from confluent_kafka.admin import AdminClient

        with translated(what):
            with self._lock:
                if self._client is None:
                    # every librdkafka client takes a logger; the stub types settings only
                    self._client = AdminClient(cast("dict[str, Setting]", self._conf))
            try:
                yield self._client
            finally:
                self._client.poll(0)  # its queued log lines, to DRIVER_LOG

    def describe(self, timeout_s: float) -> tuple[int, int]:
        """How many brokers and topics the cluster's metadata lists."""
        with self._admin("cluster metadata") as admin:
            meta = admin.list_topics(timeout=timeout_s)
        return len(meta.brokers), len(meta.topics)

    def group_lag(
        self, group: str, topics: Iterable[str], *, timeout_s: float = 3.0
    ) -> dict[str, dict[int, int]]:
        """Messages ``group`` has not committed, per topic and partition, in three batched
        requests whatever the number of topics (metadata, offsets, the group's commits).

        A partition the group never committed counts from its earliest offset; a topic that
        does not exist is left out.
        """
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        with self._admin(f"consumer lag of group {group}") as admin:
            existing = admin.list_topics(timeout=timeout_s).topics
            parts = [
                TopicPartition(t, p)
                for t in sorted(set(topics))
                if t in existing and existing[t].error is None
                for p in sorted(existing[t].partitions)
            ]
            if not parts:
                return {}

            def offsets(spec: OffsetSpec) -> dict[tuple[str, int], int]:
                futures = admin.list_offsets({tp: spec for tp in parts}, request_timeout=timeout_s)
                return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}

            high, low = offsets(OffsetSpec.latest()), offsets(OffsetSpec.earliest())
            request = [ConsumerGroupTopicPartitions(group, parts)]
            futures = admin.list_consumer_group_offsets(request, request_timeout=timeout_s)
            committed = {
                (tp.topic, tp.partition): tp.offset
                for f in futures.values()
                for tp in f.result().topic_partitions
            }
        lag: dict[str, dict[int, int]] = {}
        for (topic, partition), end in high.items():
            done = committed.get((topic, partition), -1)
            start = done if done >= 0 else low[(topic, partition)]
            lag.setdefault(topic, {})[partition] = max(0, int(end) - int(start))
        return lag

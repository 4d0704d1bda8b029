"""The training side: :class:`Publisher` sends embedding updates to ``hps_et.<model>.<table>``.

Guarantees: an idempotent producer (no duplicates, order kept per partition), every key of a
table always on the same partition (``hps.updates.partition.partition_of``), so the updates
of one key reach the consumer in the order they were published; messages of at most
``max_message_bytes``; delivery failures raised by :meth:`Publisher.flush` (and ``close``).

``Publisher(..., version=N)`` tags every message with model version ``N``: consumers apply
it to that version of the model only (docs/updates.md, "Model versions"). Without it the
messages are untagged and go to the live version (and the ready ones above it).
"""

from __future__ import annotations

import logging
import numbers
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hps.errors import BackendError, BackendUnavailable, DTypeError, InvalidValueError, ShapeError
from hps.types import Keys, Vectors
from hps.updates import codec
from hps.updates.kafka import (
    DEFAULT_PARTITIONS,
    Setting,
    check_config,
    ensure_topics,
    kafka_kwargs,
    merged,
    translated,
    with_driver_log,
)
from hps.updates.partition import split_by_partition
from hps.validate import check_not_reserved

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Setting] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "none",
}


class Publisher:
    """Publish embedding updates for HPS to consume.

    ``brokers`` is Kafka's ``bootstrap.servers``. Security and other librdkafka settings go in
    ``config`` (librdkafka names) or as keywords with underscores for dots, e.g.
    ``Publisher("b:9093", security_protocol="SASL_SSL", sasl_mechanism="PLAIN", ...)``.
    Missing topics are created with ``num_partitions`` partitions. ``version`` (a model
    version, an integer 1 ... 2**32 - 1) tags every message this publisher sends with it;
    ``None`` sends untagged messages. Model and table names must match ``[A-Za-z0-9_-]+``
    (the names of their topics, :func:`hps.updates.codec.topic_name`); explicit update
    versions must be integers within uint64. Bad input raises before anything is sent.
    """

    def __init__(
        self,
        brokers: str,
        *,
        config: Mapping[str, Setting] | None = None,
        num_partitions: int = DEFAULT_PARTITIONS,
        max_message_bytes: int = 900_000,
        create_topics: bool = True,
        version: int | None = None,
        **kafka_config: Setting,
    ) -> None:
        from confluent_kafka import Producer

        if version is not None:
            try:
                version = codec.check_model_version(version)
            except ValueError as exc:
                raise InvalidValueError(f"Publisher(version=...): {exc}") from None
        self.model_version = version  # the model version every message is tagged with
        self._header = codec.header_size(version)
        if max_message_bytes < self._header + codec.KEY_SIZE + 4:
            raise InvalidValueError(
                f"max_message_bytes {max_message_bytes} cannot hold a single row (at least "
                f"{self._header + codec.KEY_SIZE + 4} bytes)"
            )
        self.brokers = brokers
        self.num_partitions = num_partitions
        self.max_message_bytes = max_message_bytes
        self.create_topics = create_topics
        self._user_conf = merged(brokers, config, kafka_kwargs(kafka_config))
        conf = merged(
            brokers,
            PRODUCER_DEFAULTS,
            {"message.max.bytes": max(1_000_000, max_message_bytes + 65_536)},
            config,
            kafka_kwargs(kafka_config),
        )
        check_config(conf, "producer")
        with translated("creating the producer"):
            self._producer: Producer | None = Producer(with_driver_log(conf))
        self._partitions: dict[str, int] = {}
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._last_version = 0
        self._closed = False
        self.messages_sent = 0

    # -- public API -------------------------------------------------------------------------

    def publish(
        self, model: str, table: str, keys: Keys, vectors: Vectors, version: int | None = None
    ) -> int:
        """Queue upserts of ``keys`` → ``vectors`` for ``<model>.<table>``; return the version.

        Duplicate keys in one call: the last row wins. Call :meth:`flush` to wait for delivery.
        """
        self._check_open()
        k = _keys(keys, f"{model}.{table}")
        v = _vectors(vectors, k.size)
        ver = self._version(version)
        topic = codec.topic_name(model, table)
        per_message = self._rows(codec.native_row_bytes(v.shape[1]))
        for part, rows in split_by_partition(k, self._partition_count(topic), per_message):
            payload = codec.encode(k[rows], v[rows], ver, model_version=self.model_version)
            self._produce(topic, payload, part)
        return ver

    def delete(self, model: str, table: str, keys: Keys, version: int | None = None) -> int:
        """Queue deletes of ``keys`` from every level of ``<model>.<table>``; return the version."""
        self._check_open()
        k = _keys(keys, f"{model}.{table}")
        ver = self._version(version)
        topic = codec.topic_name(model, table)
        for part, rows in split_by_partition(
            k, self._partition_count(topic), self._rows(codec.KEY_SIZE)
        ):
            payload = codec.encode(
                k[rows], None, ver, delete=True, model_version=self.model_version
            )
            self._produce(topic, payload, part)
        return ver

    def prepare(self, model: str, tables: Sequence[str], timeout_s: float = 15.0) -> None:
        """Make the first publish to each of ``tables`` as fast as the next ones.

        A publisher's first message to a table otherwise waits for the topic's creation or
        partition count (one admin round trip per table) and for the producer's metadata of
        the topic (librdkafka's first fetch of it: about 1 s). This does all of it now, for
        every table at once.
        """
        self._check_open()
        topics = [codec.topic_name(model, t) for t in tables]
        self._learn_partitions(topics, timeout_s)
        with translated(f"metadata of {len(topics)} topics"):
            self._driver.list_topics(timeout=timeout_s)

    def produce_raw(self, topic: str, payload: bytes, partition: int | None = None) -> None:
        """Send an already-encoded payload (e.g. ``codec.encode_hugectr``) as it is."""
        self._produce(topic, payload, partition)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued message is delivered; raise if any could not be."""
        remaining = self._driver.flush(timeout_s)
        errors, self._errors = self._errors, []
        if errors:
            more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
            raise BackendError(
                f"kafka: {len(errors)} update messages not delivered: {'; '.join(errors[:3])}{more}"
            )
        if remaining:
            raise BackendUnavailable(
                f"kafka: {remaining} messages still undelivered after {timeout_s}s"
            )

    def close(self, timeout_s: float = 60.0) -> None:
        """Flush and release the producer, its connections and threads (idempotent). A
        closed publisher refuses to publish."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush(timeout_s)
        finally:
            self._producer = None  # librdkafka's handle goes with its last reference

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:  # do not hide the original error behind a delivery error
            try:
                self.close(timeout_s=5.0)
            except BackendError as err:
                log.warning("while closing after an error: %s", err)

    # -- internals --------------------------------------------------------------------------

    def _version(self, version: int | None) -> int:
        """The update version of a call: ``version``, or the next of the default sequence,
        ``max(clock, last + 1)``. An explicit version ahead of this publisher's clock does
        not move that sequence: consumers refuse versions beyond their clock plus an
        allowance, and a sequence that followed one would have every later default version
        refused with it."""
        with self._lock:
            now = time.time_ns()
            if version is None:
                version = max(now, self._last_version + 1)
            else:
                version = _update_version(version)
                if version > now:
                    return version
            self._last_version = max(self._last_version, version)
            return version

    def _rows(self, row_bytes: int) -> int:
        """Rows of ``row_bytes`` one message of at most ``max_message_bytes`` holds; an
        InvalidValueError where not even one fits (before anything is sent)."""
        rows = (self.max_message_bytes - self._header) // row_bytes
        if rows < 1:
            raise InvalidValueError(
                f"a row of {row_bytes:,} bytes does not fit in a message of max_message_bytes "
                f"{self.max_message_bytes:,} (with its {self._header}-byte header): raise "
                "max_message_bytes (and the broker's message.max.bytes)"
            )
        return rows

    def _partition_count(self, topic: str) -> int:
        if topic not in self._partitions:
            self._learn_partitions([topic])
        return self._partitions[topic]

    def _learn_partitions(self, topics: Sequence[str], timeout_s: float = 15.0) -> None:
        """Partition counts of the ``topics`` not known yet, creating the missing ones
        (with ``create_topics``) in one admin call."""
        missing = [t for t in topics if t not in self._partitions]
        if not missing:
            return
        if self.create_topics:
            self._partitions.update(
                ensure_topics(
                    self.brokers,
                    missing,
                    num_partitions=self.num_partitions,
                    config=self._user_conf,
                    timeout_s=timeout_s,
                )
            )
        else:
            for topic in missing:
                self._partitions[topic] = self._existing_partitions(topic)

    def _existing_partitions(self, topic: str) -> int:
        with translated(f"metadata of {topic}"):
            meta = self._driver.list_topics(topic=topic, timeout=15.0).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise BackendError(f"kafka: topic {topic!r} does not exist (create_topics=False)")
        return len(meta.partitions)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err.name()}: {err.str()}")

    @property
    def _driver(self) -> Producer:
        if self._producer is None:
            raise BackendError("publisher is closed")
        return self._producer

    def _check_open(self) -> None:
        """Refuse work on a closed publisher before anything else is done (a closed one
        creates no topic and asks the broker nothing)."""
        if self._closed:
            raise BackendError("publisher is closed")

    def _produce(self, topic: str, payload: bytes, partition: int | None) -> None:
        self._check_open()
        producer = self._driver
        # -1: librdkafka's "unassigned", its partitioner chooses
        where = -1 if partition is None else partition
        while True:
            try:
                with translated(f"producing to {topic}"):
                    producer.produce(topic, payload, partition=where, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                producer.poll(0.05)
        producer.poll(0)
        self.messages_sent += 1


def _update_version(version: object) -> int:
    """An explicit update version as an int: an integer (Python's or numpy's, not a bool)
    that fits in uint64; :class:`InvalidValueError` otherwise (1.9 is not truncated)."""
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise InvalidValueError(f"update version {version!r} is not an integer")
    if not 0 <= int(version) <= codec.UINT64_MAX:
        raise InvalidValueError(f"update version {version} does not fit in uint64")
    return int(version)


def _keys(keys: Keys, table: str) -> np.ndarray:
    """``keys`` as int64 that every tier can store; the consumer refuses the others too."""
    k = np.asarray(keys)
    if k.dtype.kind not in "iu":
        raise DTypeError(f"keys must be integers, got {k.dtype}")
    if k.ndim != 1:
        raise ShapeError(f"keys must be 1-D, got shape {k.shape}")
    if (
        k.dtype.kind == "u"
        and k.dtype.itemsize >= 8
        and k.size
        and k.max() > np.iinfo(np.int64).max
    ):
        raise InvalidValueError("keys must fit in int64")
    k = k.astype(np.int64, copy=False)
    check_not_reserved(table, k)
    return k


def _vectors(vectors: Vectors, n: int) -> np.ndarray:
    v = np.asarray(vectors)
    if v.dtype.kind not in "fiu":
        raise DTypeError(f"vectors must be float32-compatible numbers, got {v.dtype}")
    v = v.astype(np.float32, copy=False)
    if v.ndim != 2 or v.shape[0] != n or v.shape[1] == 0:
        raise ShapeError(f"vectors must have shape ({n}, dim), got {v.shape}")
    if not np.isfinite(v).all():
        raise InvalidValueError("vectors contain NaN or inf")
    return v

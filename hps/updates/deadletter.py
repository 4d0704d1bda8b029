"""The dead-letter topic: messages that cannot be applied, with the reason in a header.

Each dead letter keeps the original key and payload and adds the headers ``hps_reason``,
``hps_topic``, ``hps_partition``, ``hps_offset`` and ``hps_timestamp_ms``. A letter must fit
the producer's ``message.max.bytes`` (key, payload and headers together, as librdkafka
counts them) and a broker's limits: a payload over :data:`MAX_PAYLOAD_BYTES`, or one that
would make the letter too large, is left out (header ``hps_payload_bytes``: its size), then
the key if the letter is still too large (header ``hps_key_bytes``). What is left out stays
in its topic at that offset until the topic's retention. A letter the producer or the broker
still refuses for its size (a dead-letter topic with a smaller ``max.message.bytes``) is sent
again without payload and key. A letter refused for its size would otherwise fail its batch,
which is retried for ever: the partition would be blocked for good. The consumer flushes
dead letters before committing past them, so none is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hps.errors import BackendUnavailable
from hps.updates.kafka import (
    Setting,
    client_settings,
    ensure_topics,
    merged,
    translated,
    with_driver_log,
)

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

log = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES = 900_000
"""The largest payload a dead letter carries: under Kafka's 1 MB default limits (the
producer's ``message.max.bytes``, a broker's ``message.max.bytes``) with room for headers."""

DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""

RECORD_OVERHEAD = 64
"""Bytes librdkafka counts for a record besides its key, value and headers (its varints and
attributes: 36 bytes at most), with room to spare."""

HEADER_OVERHEAD = 10
"""Bytes a header costs besides its name and value (their two length varints)."""

SIZE_ERRORS = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})
"""librdkafka's names of the errors that refuse a message for its size (the producer's
check and the broker's answers ``MESSAGE_TOO_LARGE``, ``RECORD_LIST_TOO_LARGE``)."""

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class Letter:
    """One dead letter as it is sent: what it carries and what was left out."""

    key: bytes | None
    payload: bytes | None
    headers: Headers

    @property
    def size(self) -> int:
        """The bytes librdkafka counts against ``message.max.bytes`` (an upper bound)."""
        return letter_size(self.key, self.payload, self.headers)

    def bare(self) -> Letter:
        """The same letter without payload and key, their sizes in headers."""
        return Letter(None, None, [*self.headers, *_left_out(self.key, self.payload)])


def letter_size(key: bytes | None, payload: bytes | None, headers: Headers) -> int:
    heads = sum(HEADER_OVERHEAD + len(n) + len(v or b"") for n, v in headers)
    return RECORD_OVERHEAD + len(key or b"") + len(payload or b"") + heads


def _left_out(key: bytes | None, payload: bytes | None) -> Headers:
    out: Headers = []
    if payload is not None:
        out.append(("hps_payload_bytes", str(len(payload)).encode()))
    if key is not None:
        out.append(("hps_key_bytes", str(len(key)).encode()))
    return out


def fitted(key: bytes | None, payload: bytes | None, headers: Headers, limit: int) -> Letter:
    """The letter of ``key``, ``payload`` and ``headers`` within ``limit`` bytes: the payload
    left out when it is over :data:`MAX_PAYLOAD_BYTES` or the letter over ``limit``, then the
    key when the letter is still over it (each one's size in a header)."""
    letter = Letter(key, payload, headers)
    if payload is not None and (len(payload) > MAX_PAYLOAD_BYTES or letter.size > limit):
        letter = Letter(key, None, [*headers, *_left_out(None, payload)])
    if key is not None and letter.size > limit:
        letter = Letter(None, None, [*letter.headers, *_left_out(key, None)])
    return letter


class DeadLetters:
    def __init__(
        self, brokers: str, topic: str, config: Mapping[str, Setting] | None = None
    ) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        ensure_topics(brokers, [topic], num_partitions=1, config=config)
        conf = merged(
            brokers, {"enable.idempotence": True, "linger.ms": 0}, client_settings(config)
        )
        self.max_bytes = int(conf.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
        with translated("creating the dead-letter producer"):
            self._producer = Producer(with_driver_log(conf))
        self._errors: list[str] = []
        self._too_large: list[Letter] = []  # refused for their size: sent again bare
        self.sent = 0

    def send(self, msg: Message, reason: str) -> None:
        """Queue ``msg`` with ``reason``; :meth:`flush` delivers."""
        _, ts = msg.timestamp()
        headers: Headers = [
            ("hps_reason", reason.encode()),
            ("hps_topic", (msg.topic() or "").encode()),
            ("hps_partition", str(msg.partition()).encode()),
            ("hps_offset", str(msg.offset()).encode()),
            ("hps_timestamp_ms", str(ts).encode()),
        ]
        letter = fitted(msg.key(), msg.value(), headers, self.max_bytes)
        log.warning("dead letter %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        self._produce(letter)
        self.sent += 1

    def _produce(self, letter: Letter) -> None:
        from confluent_kafka import KafkaException

        while True:
            try:
                self._producer.produce(
                    self.topic,
                    letter.payload,
                    letter.key,
                    headers=letter.headers,
                    on_delivery=self._reporter(letter),
                )
                return
            except BufferError:  # the local queue is full: serve delivery reports first
                self._producer.poll(0.05)
            except KafkaException as exc:
                if _is_bare(letter) or not _size_error(exc.args[0] if exc.args else None):
                    with translated(f"sending a dead letter to {self.topic}"):
                        raise
                self._refused(letter)
                letter = letter.bare()

    def _reporter(self, letter: Letter) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                return
            if _size_error(err) and not _is_bare(letter):
                self._too_large.append(letter)
            else:
                self._errors.append(f"{err.name()}: {err.str()}")

        return report

    def _refused(self, letter: Letter) -> None:
        log.warning(
            "dead letter of %d bytes refused for its size by %s; sent without its payload and key",
            letter.size,
            self.topic,
        )

    def flush(self, timeout_s: float = 30.0) -> None:
        """Deliver every queued dead letter or raise BackendUnavailable (the batch is
        retried). Letters refused for their size are sent again without payload and key."""
        remaining = self._producer.flush(timeout_s)
        while self._too_large and not remaining:
            again, self._too_large = self._too_large, []
            for letter in again:
                self._refused(letter)
                self._produce(letter.bare())
            remaining = self._producer.flush(timeout_s)
        errors, self._errors = self._errors, []
        self._too_large = []
        if remaining or errors:
            raise BackendUnavailable(
                f"kafka: dead letters not delivered to {self.topic} "
                f"({remaining} pending; {'; '.join(errors[:3])})"
            )

    def close(self) -> None:
        self._producer.flush(5.0)


def _size_error(err: object) -> bool:
    name = getattr(err, "name", None)
    return callable(name) and name() in SIZE_ERRORS


def _is_bare(letter: Letter) -> bool:
    return letter.key is None and letter.payload is None

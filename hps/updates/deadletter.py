"""The dead-letter topic: messages that cannot be decoded, with the reason in a header.

Each dead letter keeps the original key and payload and adds the headers ``hps_reason``,
``hps_topic``, ``hps_partition``, ``hps_offset`` and ``hps_timestamp_ms``. A payload over
:data:`MAX_PAYLOAD_BYTES` is left out (header ``hps_payload_bytes``: its size; the message
stays in its topic at that offset until the topic's retention): a letter a producer or a
broker would refuse for its size would block the partition for good. The consumer flushes
dead letters before committing past them, so none is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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


class DeadLetters:
    def __init__(
        self, brokers: str, topic: str, config: Mapping[str, Setting] | None = None
    ) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        ensure_topics(brokers, [topic], num_partitions=1, config=config)
        producer_conf = client_settings(config)
        with translated("creating the dead-letter producer"):
            self._producer = Producer(
                with_driver_log(
                    merged(brokers, {"enable.idempotence": True, "linger.ms": 0}, producer_conf)
                )
            )
        self._errors: list[str] = []
        self.sent = 0

    def send(self, msg: Message, reason: str) -> None:
        """Queue ``msg`` with ``reason``; :meth:`flush` delivers."""
        _, ts = msg.timestamp()
        headers: list[tuple[str, str | bytes | None]] = [
            ("hps_reason", reason.encode()),
            ("hps_topic", (msg.topic() or "").encode()),
            ("hps_partition", str(msg.partition()).encode()),
            ("hps_offset", str(msg.offset()).encode()),
            ("hps_timestamp_ms", str(ts).encode()),
        ]
        payload = msg.value()
        if payload is not None and len(payload) > MAX_PAYLOAD_BYTES:
            headers.append(("hps_payload_bytes", str(len(payload)).encode()))
            payload = None
        log.warning("dead letter %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        while True:
            try:
                with translated(f"sending a dead letter to {self.topic}"):
                    self._producer.produce(
                        self.topic, payload, msg.key(), headers=headers, on_delivery=self._report
                    )
                break
            except BufferError:
                self._producer.poll(0.05)
        self.sent += 1

    def _report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{err.name()}: {err.str()}")

    def flush(self, timeout_s: float = 30.0) -> None:
        """Deliver every queued dead letter or raise BackendUnavailable (the batch is retried)."""
        remaining = self._producer.flush(timeout_s)
        errors, self._errors = self._errors, []
        if remaining or errors:
            raise BackendUnavailable(
                f"kafka: dead letters not delivered to {self.topic} "
                f"({remaining} pending; {'; '.join(errors[:3])})"
            )

    def close(self) -> None:
        self._producer.flush(5.0)

"""``update_source`` of the ps.json: where online updates come from (Kafka)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from hps.config.common import Frozen, from_env

MAX_VERSION_AHEAD_S = 30 * 86_400.0  # a month: the bound keeps the ns arithmetic finite
UPDATE_TOPIC_RE = re.compile(r"hps_et\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+")
KAFKA_TOPIC_RE = re.compile(r"[A-Za-z0-9._\-]{1,249}")  # what a broker accepts as a topic name
"""An update topic's name, ``hps_et.<model>.<table>`` (:func:`hps.updates.codec.topic_name`)."""


class UpdateSourceConfig(Frozen):
    type: Literal["null", "kafka_message_queue", "kafka", "kafka_mq"] = "null"
    brokers: str = "127.0.0.1:9092"
    metadata_refresh_interval_ms: int = Field(default=30_000, ge=1)
    receive_buffer_size: int = Field(default=256 * 1024, ge=1)
    poll_timeout_ms: int = Field(default=500, ge=1)
    max_batch_size: int = Field(default=8192, ge=1)
    failure_backoff_ms: int = Field(default=50, ge=1)
    max_commit_interval: int = Field(default=32, ge=1)
    hps_group_id: str = "hps"
    hps_dead_letter_topic: str = "hps_et.dead_letter"
    hps_max_version_ahead_s: float = Field(
        default=300.0,
        ge=0.0,
        le=MAX_VERSION_AHEAD_S,
        description="an update version (ns) beyond the consumer's clock (or an earlier message "
        "timestamp) + this is refused",
    )
    hps_l1_refresh: Literal["listener", "journal"] = Field(
        default="listener",
        description="with a shared L2 (or none): how serving L1s learn of updates: each "
        "process reads the topics (listener), or hps consume tells them through the node's "
        "change journal (journal: it must write every tier they read)",
    )
    hps_kafka_config: dict[str, str | int | bool] = {}
    hps_kafka_config_env: dict[str, str] = Field(
        default={},
        description="librdkafka setting -> env variable NAME holding it, or NAME_FILE a file",
    )

    @field_validator("hps_dead_letter_topic")
    @classmethod
    def _dead_letters_apart(cls, v: str) -> str:
        if v and (not KAFKA_TOPIC_RE.fullmatch(v) or v in (".", "..")):
            raise ValueError(
                f"{v!r} is no Kafka topic name: 1 to 249 of the letters, digits, '.', '_' "
                "and '-' (not '.' or '..'); \"\" drops dead letters instead"
            )
        # a consumer of that topic would read its own dead letters back, refuse them again
        # and send them there again: for ever
        if UPDATE_TOPIC_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} has the name of an update topic (hps_et.<model>.<table>); dead letters "
                "must go to a topic that is not consumed, e.g. hps_et.dead_letter"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _kafka_secrets_from_env(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        env, given = data.get("hps_kafka_config_env"), data.get("hps_kafka_config")
        if isinstance(env, dict) and env and isinstance(given, dict | None):  # else: its error
            resolved = {k: from_env(str(v), f"hps_kafka_config_env.{k}") for k, v in env.items()}
            data = {**data, "hps_kafka_config": {**(given or {}), **resolved}}
        return data

    @property
    def enabled(self) -> bool:
        return self.type != "null"

    @property
    def kafka_settings(self) -> dict[str, str | int | bool]:
        """The librdkafka settings of every client: HugeCTR's ``metadata_refresh_interval_ms``
        and ``receive_buffer_size`` as ``topic.metadata.refresh.interval.ms`` and
        ``socket.receive.buffer.bytes``, then ``hps_kafka_config`` (which wins)."""
        return {
            "topic.metadata.refresh.interval.ms": self.metadata_refresh_interval_ms,
            "socket.receive.buffer.bytes": self.receive_buffer_size,
            **self.hps_kafka_config,
        }

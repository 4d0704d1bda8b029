"""confluent-kafka plumbing shared by the producer, the consumer and the listeners.

Driver exceptions are translated here into :mod:`hps.errors`, by :func:`translated` around
every driver call; nothing else in HPS catches ``KafkaException``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from hps.errors import BackendError, BackendUnavailable, ClientLost, ConfigError, DecodeError
from hps.redact import REDACTED, is_secret_name, scrub
from hps.updates.codec import parse_topic

if TYPE_CHECKING:
    from confluent_kafka import KafkaError

    from hps.config import PSConfig

log = logging.getLogger(__name__)

Setting = str | int | float | bool
"""The value of a librdkafka setting (named as librdkafka names it: ``security.protocol``)."""

DRIVER_LOG = logging.getLogger("hps.updates.librdkafka")
"""Where librdkafka's own log lines go (a broker unreachable, a reconnect) from the producers
and consumers HPS makes, served by their ``poll``/``flush``: Python logging, never straight
to stderr."""


def with_driver_log(conf: Mapping[str, Setting]) -> dict[str, Setting | logging.Logger]:
    """``conf`` for a long-lived producer or consumer, its log lines sent to :data:`DRIVER_LOG`."""
    return {**conf, "logger": DRIVER_LOG}


# A consumer group's join waits about half the session timeout on some brokers (Tansu), and a
# crashed member holds its partitions for a whole one: 10 s (Kafka's pre-3.0 default) keeps
# fail-over short. Both can be overridden through update_source.hps_kafka_config.
CONSUMER_DEFAULTS: dict[str, Setting] = {
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1_000,
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # Tansu does not wake a waiting fetch when data arrives: bound the wait.
    "fetch.wait.max.ms": 100,
}

DEFAULT_PARTITIONS = 8

UPDATE_TOPIC_CONFIG: dict[str, str] = {"message.timestamp.type": "LogAppendTime"}
"""Settings of the update topics HPS creates: the broker stamps every message with its own
clock, which the producer cannot set (the version bound, :func:`hps.updates.codec.check_version`,
and the version of HugeCTR-format messages, which is their timestamp)."""


def kafka_kwargs(kwargs: Mapping[str, Setting]) -> dict[str, Setting]:
    """Python keyword names to librdkafka names: ``security_protocol`` → ``security.protocol``."""
    return {k.replace("_", "."): v for k, v in kwargs.items()}


def merged(brokers: str, *layers: Mapping[str, Setting] | None) -> dict[str, Setting]:
    """``bootstrap.servers`` plus each layer of settings, later layers winning."""
    conf: dict[str, Setting] = {"bootstrap.servers": brokers}
    for layer in layers:
        if layer:
            conf.update(layer)
    return conf


@contextmanager
def translated(what: str, *, ignore: Iterable[str] = ()) -> Iterator[None]:
    """Run driver calls; a KafkaException becomes an HPS error naming ``what``.

    Errors whose librdkafka name is in ``ignore`` (e.g. ``_NO_OFFSET`` of an empty commit,
    ``TOPIC_ALREADY_EXISTS``) are swallowed.
    """
    from confluent_kafka import KafkaException

    try:
        yield
    except KafkaException as exc:
        err = _kafka_error(exc)
        if err is not None and err.name() in set(ignore):
            return
        raise _translate(exc, what) from None


def _kafka_error(exc: BaseException) -> KafkaError | None:
    """The librdkafka error a confluent-kafka exception carries (normally its only argument)."""
    from confluent_kafka import KafkaError

    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def _translate(exc: BaseException, what: str) -> BackendError:
    """A confluent-kafka exception as an HPS error (retriable ones as BackendUnavailable)."""
    err = _kafka_error(exc)
    name = type(exc).__name__ if err is None else err.name()
    text = str(exc) if err is None else err.str()
    retriable = (err is not None and bool(err.retriable())) or name in {
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_TIMED_OUT",
        "REQUEST_TIMED_OUT",
        "_MSG_TIMED_OUT",
    }
    fatal = err is not None and bool(err.fatal())
    cls = ClientLost if fatal else BackendUnavailable if retriable else BackendError
    return cls(scrub(f"kafka: {what}: {name}: {text}"))


def ensure_topics(
    brokers: str,
    topics: Iterable[str],
    *,
    num_partitions: int = DEFAULT_PARTITIONS,
    config: Mapping[str, Setting] | None = None,
    timeout_s: float = 15.0,
) -> dict[str, int]:
    """Create the topics that do not exist yet; return each topic's partition count.

    Update topics (``hps_et.<model>.<table>``) are created with :data:`UPDATE_TOPIC_CONFIG`
    (``LogAppendTime``); other topics (the dead-letter topic) with the broker's defaults.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    wanted = sorted(set(topics))
    if not wanted:
        return {}
    with translated(f"creating topics {_short_list(wanted)}"):
        # every librdkafka client takes a logger; the stub types settings only
        admin = AdminClient(
            cast("dict[str, Setting]", with_driver_log(admin_conf(brokers, config)))
        )
        existing = admin.list_topics(timeout=timeout_s).topics
        missing = [t for t in wanted if t not in existing]
        if missing:
            futures = admin.create_topics(
                [
                    NewTopic(
                        t,
                        num_partitions=num_partitions,
                        replication_factor=1,
                        config=dict(UPDATE_TOPIC_CONFIG) if _is_update_topic(t) else {},
                    )
                    for t in missing
                ],
                operation_timeout=timeout_s,
                request_timeout=timeout_s,
            )
            created = []
            for topic, fut in futures.items():
                with translated(f"creating topic {topic}", ignore={"TOPIC_ALREADY_EXISTS"}):
                    fut.result()
                    created.append(topic)
            if created:  # one line for a model's many tables
                log.info("created %d topic(s) with %d partition(s) each: %s", len(created),
                         num_partitions, _short_list(sorted(created)))  # fmt: skip
        counts: dict[str, int] = {}
        for t in wanted:
            meta = admin.list_topics(topic=t, timeout=timeout_s).topics.get(t)
            if meta is None or meta.error is not None or not meta.partitions:
                raise BackendUnavailable(f"kafka: topic {t!r} has no partitions yet")
            counts[t] = len(meta.partitions)
    return counts


def _is_update_topic(topic: str) -> bool:
    try:
        parse_topic(topic)
    except DecodeError:
        return False
    return True


def _short_list(topics: list[str]) -> str:
    return ", ".join(topics[:3]) + (f" (+{len(topics) - 3})" if len(topics) > 3 else "")


CONSUMER_ONLY = (
    "enable.auto.",
    "auto.offset.",
    "session.",
    "heartbeat.",
    "fetch.",
    "group.",
    "isolation.",
    "max.poll.",
    "partition.assignment.",
)


def client_settings(config: Mapping[str, Setting] | None) -> dict[str, Setting]:
    """The settings of ``config`` that apply to a producer or admin client (security, ...)."""
    return {k: v for k, v in (config or {}).items() if not k.startswith(CONSUMER_ONLY)}


def admin_conf(brokers: str, config: Mapping[str, Setting] | None) -> dict[str, Setting]:
    """An admin client's settings: the client's of ``config``, none of a producer's."""
    layer = client_settings(config)
    for k in ("enable.idempotence", "acks", "linger.ms", "message.max.bytes", "compression.type"):
        layer.pop(k, None)
    return merged(brokers, layer)


def check_config(conf: Mapping[str, Setting], role: str) -> None:
    """Reject settings that would break our delivery guarantees."""
    if role == "consumer" and conf.get("enable.auto.commit") not in (False, "false"):
        raise ConfigError(
            "hps_kafka_config: enable.auto.commit must stay false (commit after apply)"
        )
    if role == "consumer" and conf.get("enable.auto.offset.store") not in (False, "false"):
        raise ConfigError("hps_kafka_config: enable.auto.offset.store must stay false")
    if role == "producer" and conf.get("enable.idempotence") not in (True, "true"):
        raise ConfigError("producer: enable.idempotence must stay true (ordered, no duplicates)")


def check_update_source(config: PSConfig) -> None:
    """At a process's start: the Kafka client settings of an enabled update source are valid
    (:func:`check_settings`)."""
    us = config.update_source
    if us.enabled:
        check_settings(us.kafka_settings, f"{config.source}: update_source.hps_kafka_config")


def check_settings(settings: Mapping[str, Setting], where: str) -> None:
    """Have librdkafka check every setting of ``settings`` once, no broker contacted.

    A misspelled name or a bad value (``hps_kafka_config``) is then a ConfigError at start
    that names the setting, not a failure of a later request. The message never holds the
    value of a secret-named setting (hps.redact).
    """
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError:
        raise ConfigError(
            f"{where}: a Kafka update source needs confluent-kafka (pip install 'hps[kafka]')"
        ) from None
    # librdkafka's own remarks (a consumer setting given to a producer) are not errors here.
    quiet = logging.getLogger(f"{__name__}.check")
    quiet.propagate, quiet.disabled = False, True
    try:
        Producer({**settings, "logger": quiet})  # no bootstrap.servers: nothing is contacted
    except KafkaException as exc:
        err = _kafka_error(exc)
        text = str(exc) if err is None else err.str()
        raise ConfigError(f"{where}: {_hide_values(text.strip(), settings)}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {_hide_values(str(exc), settings)}") from None


def _hide_values(text: str, settings: Mapping[str, Setting]) -> str:
    secrets = [str(v) for k, v in settings.items() if is_secret_name(k) and str(v)]
    text = scrub(text, extra=secrets)
    for key, value in settings.items():
        if is_secret_name(key) and str(value) and str(value) in text:  # a short one
            # the message is withheld whole; name the setting it is about where it says
            named = [k for k in settings if "." in k and k in text]
            what = f"setting {max(named, key=len)!r}" if named else "settings"
            return f"invalid {what} (the message is withheld: it shows {key!r}'s {REDACTED} value)"
    return text

"""A publisher's driver: its log lines go through Python logging, and close() releases it.

The broker is a loopback port nobody listens on: librdkafka's connection attempts fail,
which is what it logs, and a queued message stays undelivered.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hps.errors import BackendError, BackendUnavailable, InvalidValueError
from hps.net import free_port
from hps.updates import Publisher, codec
from hps.updates.kafka import DRIVER_LOG


@pytest.fixture
def publisher() -> Publisher:
    return Publisher(f"127.0.0.1:{free_port()}", create_topics=False, reconnect_backoff_ms=10)


def test_an_unreachable_broker_is_logged_through_python_logging_not_stderr(
    publisher: Publisher, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    payload = codec.encode([1], [[0.5, 0.5]], 1)
    with caplog.at_level(logging.DEBUG, logger=DRIVER_LOG.name):
        publisher.produce_raw("hps_et.m.t", payload, 0)
        with pytest.raises(BackendUnavailable, match="1 messages still undelivered"):
            publisher.close(timeout_s=1.0)
    assert any(r.name == DRIVER_LOG.name and "127.0.0.1" in r.getMessage() for r in caplog.records)
    assert "rdkafka" not in capfd.readouterr().err


@pytest.mark.parametrize("key", [np.iinfo(np.int64).min, np.iinfo(np.int64).min + 1])
def test_reserved_keys_are_refused_before_anything_is_queued(
    publisher: Publisher, key: int
) -> None:
    with pytest.raises(InvalidValueError, match=r"m\.t: keys \[.*\] are reserved"):
        publisher.publish("m", "t", np.array([1, key]), np.ones((2, 2), np.float32))
    with pytest.raises(InvalidValueError, match="are reserved"):
        publisher.delete("m", "t", np.array([key]))
    publisher.close(timeout_s=1.0)  # nothing was queued: nothing to wait for


@pytest.mark.parametrize("dtype", ["<u8", ">u8"])
def test_unsigned_keys_beyond_int64_are_refused_in_either_byte_order(
    publisher: Publisher, dtype: str
) -> None:
    keys = np.array([1, 2**63 + 5], dtype=dtype)  # a cast would wrap it into a negative key
    with pytest.raises(InvalidValueError, match="keys must fit in int64"):
        publisher.publish("m", "t", keys, np.ones((2, 2), np.float32))
    publisher.close(timeout_s=1.0)


def test_a_closed_publisher_has_released_its_driver_and_refuses_to_publish(
    publisher: Publisher,
) -> None:
    publisher.close(timeout_s=1.0)  # nothing queued: nothing to wait for
    publisher.close()  # idempotent
    assert publisher._producer is None
    with pytest.raises(BackendError, match="publisher is closed"):
        publisher.produce_raw("hps_et.m.t", b"", 0)
    with pytest.raises(BackendError, match="publisher is closed"):
        publisher.flush(1.0)


def test_a_closed_publisher_creates_no_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """publish() and delete() learned the topic's partitions (creating it) before they saw
    that the publisher was closed."""
    from hps.updates import producer

    created: list[list[str]] = []
    monkeypatch.setattr(producer, "ensure_topics", lambda b, topics, **kw: created.append(topics))
    pub = Publisher(f"127.0.0.1:{free_port()}", reconnect_backoff_ms=10)  # creates topics
    pub.close(timeout_s=1.0)
    with pytest.raises(BackendError, match="publisher is closed"):
        pub.publish("m", "t", np.array([1]), np.ones((1, 2), np.float32))
    with pytest.raises(BackendError, match="publisher is closed"):
        pub.delete("m", "t", np.array([1]))
    with pytest.raises(BackendError, match="publisher is closed"):
        pub.prepare("m", ["t"])
    assert created == []


def test_a_version_ahead_of_the_clock_does_not_drag_the_default_ones_with_it(
    publisher: Publisher,
) -> None:
    """Consumers refuse versions beyond their clock plus an allowance: default versions
    that followed an explicit one from the future would all be refused with it."""
    import time

    future = time.time_ns() + 10**9 * 86_400 * 365  # a year ahead
    assert publisher._version(future) == future
    after = publisher._version(None)
    assert after < future and abs(after - time.time_ns()) < 60 * 10**9
    assert publisher._version(None) > after  # the default sequence still rises
    assert publisher._version(5) == 5  # an explicit version from the past: kept as given
    assert publisher._version(None) > after
    publisher.close(timeout_s=1.0)


@pytest.mark.parametrize(("model", "table"), [("pm.x", "t0"), ("p m", "t0"), ("pm", "")])
def test_names_no_consumer_reads_are_refused_before_a_topic_is_made(
    monkeypatch: pytest.MonkeyPatch, model: str, table: str
) -> None:
    """hps_et.pm.x.t0 was created and written to; no consumer ever matched its name."""
    from hps.updates import producer

    created: list[list[str]] = []
    monkeypatch.setattr(producer, "ensure_topics", lambda b, topics, **kw: created.append(topics))
    pub = Publisher(f"127.0.0.1:{free_port()}", reconnect_backoff_ms=10)  # creates topics
    with pytest.raises(InvalidValueError, match=r"must match \[A-Za-z0-9_-\]\+"):
        pub.publish(model, table, np.array([1]), np.ones((1, 2), np.float32))
    with pytest.raises(InvalidValueError, match=r"must match \[A-Za-z0-9_-\]\+"):
        pub.delete(model, table, np.array([1]))
    with pytest.raises(InvalidValueError, match=r"must match \[A-Za-z0-9_-\]\+"):
        pub.prepare(model, [table])
    assert created == [] and pub.messages_sent == 0
    pub.close(timeout_s=1.0)


def test_a_row_wider_than_a_message_is_refused_before_a_topic_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It went out as one message over the configured max_message_bytes."""
    from hps.updates import producer

    created: list[list[str]] = []
    monkeypatch.setattr(producer, "ensure_topics", lambda b, topics, **kw: created.append(topics))
    pub = Publisher(f"127.0.0.1:{free_port()}", max_message_bytes=4_000, reconnect_backoff_ms=10)
    with pytest.raises(InvalidValueError, match="does not fit in a message of max_message_bytes"):
        pub.publish("m", "t", np.array([1]), np.ones((1, 1024), np.float32))  # 4,104 bytes
    assert created == [] and pub.messages_sent == 0
    pub.close(timeout_s=1.0)


@pytest.mark.parametrize("version", [1.9, "abc", "5", True, 2.0])
def test_an_update_version_that_is_no_integer_is_refused(
    publisher: Publisher, version: object
) -> None:
    """1.9 was truncated to 1 without a word; "abc" raised a bare ValueError."""
    with pytest.raises(InvalidValueError, match=r"update version .* is not an integer"):
        publisher.publish("m", "t", np.array([1]), np.ones((1, 2), np.float32), version=version)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"update version .* is not an integer"):
        publisher.delete("m", "t", np.array([1]), version=version)  # type: ignore[arg-type]
    publisher.close(timeout_s=1.0)  # nothing was queued


@pytest.mark.parametrize("version", [1.9, "abc", "5", True, 2.0])
def test_a_model_version_that_is_no_integer_is_refused(version: object) -> None:
    with pytest.raises(InvalidValueError, match=r"model version .* is not an integer"):
        Publisher(f"127.0.0.1:{free_port()}", version=version)  # type: ignore[arg-type]


def test_numpy_integers_are_versions(publisher: Publisher) -> None:
    assert publisher._version(np.int64(7)) == 7 and publisher._version(np.uint64(8)) == 8
    pub = Publisher(f"127.0.0.1:{free_port()}", create_topics=False, version=np.uint32(3))  # type: ignore[arg-type]
    assert pub.model_version == 3 and type(pub.model_version) is int
    pub.close(timeout_s=1.0)
    publisher.close(timeout_s=1.0)

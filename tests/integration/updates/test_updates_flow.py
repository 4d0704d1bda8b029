"""Publish → consume → lookup against a real broker (Tansu) and real stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from hps.build import build_session
from hps.testing.kafka import TansuBroker
from hps.updates import Publisher, codec
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_config, wait_for
from tests.helpers import rows

pytestmark = pytest.mark.integration


def test_publish_consume_lookup(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)
    keys = np.arange(500, dtype=np.int64)
    try:
        with running(build_service(cfg, session)):
            with Publisher(kafka_broker.bootstrap) as pub:
                pub.publish(model, "t0", keys, rows(keys, 4, seed=1))
                pub.publish(model, "t1", keys, rows(keys, 8, seed=2))
                pub.delete(model, "t0", keys[:10])
            assert session.tiers.persistent is not None
            l3 = session.tiers.persistent
            # the end state, not a count: the upserts alone may count 1000 before the delete
            wait_for(
                lambda: l3.size(f"{model}.t0") == 490 and l3.size(f"{model}.t1") == 500,
                60,
                "every message applied",
            )
        got = session.lookup(f"{model}.t0", keys)
        np.testing.assert_array_equal(got[10:], rows(keys[10:], 4, seed=1))
        np.testing.assert_array_equal(got[:10], np.full((10, 4), 0.5, np.float32))  # deleted
        np.testing.assert_array_equal(session.lookup(f"{model}.t1", keys), rows(keys, 8, seed=2))
        assert session.tiers.persistent is not None
        assert session.tiers.persistent.size(f"{model}.t0") == 490
    finally:
        session.close()


def test_hugectr_format_messages_are_applied(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)
    keys = np.arange(100, 164, dtype=np.int64)
    try:
        with running(build_service(cfg, session)) as svc:
            with Publisher(kafka_broker.bootstrap) as pub:
                topic = codec.topic_name(model, "t1")
                for part in np.array_split(keys, 4):  # several messages, as HugeCTR's sink
                    pub.produce_raw(topic, codec.encode_hugectr(part, rows(part, 8, seed=3)))
                pub.produce_raw(topic, codec.encode_hugectr(keys[:0], rows(keys[:0], 8)))  # beacon
            wait_for(lambda: svc.rows_applied >= keys.size, 60, "HugeCTR rows applied")
            assert svc.dead_letters is not None and svc.dead_letters.sent == 0
        np.testing.assert_array_equal(session.lookup(f"{model}.t1", keys), rows(keys, 8, seed=3))
    finally:
        session.close()


def _read_topic(brokers: str, topic: str, n: int) -> list[Any]:
    c = Consumer(
        {"bootstrap.servers": brokers, "group.id": "dlq-reader", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[Any] = []
    try:
        wait_for(lambda: out.extend(c.consume(10, 0.2)) or len(out) >= n, 30, f"{n} dead letters")
    finally:
        c.close()
    return out


def test_malformed_messages_go_to_the_dead_letter_topic(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)
    good = np.arange(40, dtype=np.int64)
    t0 = codec.topic_name(model, "t0")
    bad = {
        b"garbage!": "DecodeError",
        codec.encode(good[:3], rows(good[:3], 4), 1)[:-2]: "DecodeError",  # truncated
        codec.encode(good[:2], rows(good[:2], 6), 1): "ShapeError",  # wrong dim
        codec.encode(good[:1], np.full((1, 4), np.inf, np.float32), 1): "InvalidValueError",
    }
    try:
        with running(build_service(cfg, session)) as svc:
            with Publisher(kafka_broker.bootstrap) as pub:
                pub.publish(model, "t0", good[:20], rows(good[:20], 4, seed=5))
                for payload in bad:
                    pub.produce_raw(t0, payload, partition=0)
                pub.publish(model, "t0", good[20:], rows(good[20:], 4, seed=5))
            wait_for(lambda: svc.rows_applied >= good.size, 60, "good rows applied")
            letters = _read_topic(
                kafka_broker.bootstrap, cfg.update_source.hps_dead_letter_topic, 4
            )
        np.testing.assert_array_equal(session.lookup(f"{model}.t0", good), rows(good, 4, seed=5))
        assert len(letters) == 4
        for letter in letters:
            headers = dict(letter.headers())
            assert headers["hps_topic"] == t0.encode()
            assert headers["hps_partition"] == b"0"
            assert headers["hps_reason"].decode().startswith(bad[letter.value()])
    finally:
        session.close()


def test_redis_down_during_consumption_loses_nothing(
    tmp_path: Path, kafka_broker: TansuBroker, redis_server: Any, redis_address: str
) -> None:
    cfg = update_config(
        tmp_path,
        kafka_broker.bootstrap,
        volatile={"type": "redis", "address": redis_address, "num_partitions": 2},
        failure_backoff_ms=20,
    )
    model = cfg.models[0].model
    table = f"{model}.t0"
    session = build_session(cfg, with_cache=False)
    a, b = np.arange(0, 100, dtype=np.int64), np.arange(100, 300, dtype=np.int64)
    try:
        with running(build_service(cfg, session)) as svc, Publisher(kafka_broker.bootstrap) as pub:
            pub.publish(model, "t0", a, rows(a, 4, seed=1))
            pub.flush()
            wait_for(lambda: svc.rows_applied >= a.size, 60, "batch A applied")
            redis_server.stop()
            pub.publish(model, "t0", b, rows(b, 4, seed=2))
            pub.flush()
            wait_for(lambda: svc.failures >= 2, 60, "the consumer to retry while Redis is down")
            assert svc.rows_applied == a.size
            redis_server.start()  # back empty: it keeps nothing on disk
            wait_for(lambda: svc.rows_applied >= a.size + b.size, 60, "batch B applied")
        assert session.tiers.volatile is not None and session.tiers.persistent is not None
        v2, f2 = session.tiers.volatile.fetch(table, b)
        assert f2.all()
        np.testing.assert_array_equal(v2, rows(b, 4, seed=2))
        both = np.concatenate([a, b])
        v3, f3 = session.tiers.persistent.fetch(table, both)
        assert f3.all()
        np.testing.assert_array_equal(v3, np.concatenate([rows(a, 4, seed=1), rows(b, 4, seed=2)]))
    finally:
        session.close()


def test_publish_cli_pushes_a_sparse_model(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    import json

    from hps.cli import main
    from hps.io.sparse_model import write_sparse_model
    from tests.fixtures.kafka import update_doc

    doc = update_doc(tmp_path, kafka_broker.bootstrap)
    model = doc["models"][0]["model"]
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    keys = np.arange(1000, 4000, dtype=np.int64)
    write_sparse_model(tmp_path / "t1.model", keys, rows(keys, 8, seed=4))
    argv = ["publish", "--config", str(tmp_path / "ps.json"), "--table", f"{model}.t1"]
    assert main([*argv, "--sparse", str(tmp_path / "t1.model"), "--chunk-rows", "700"]) == 0
    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    cfg = cfg.model_copy(update={"models": [cfg.models[0].model_copy(update={"model": model})]})
    session = build_session(cfg, with_cache=False)
    try:
        with running(build_service(cfg, session)) as svc:
            wait_for(lambda: svc.rows_applied >= keys.size, 60, "the whole table applied")
        np.testing.assert_array_equal(session.lookup(f"{model}.t1", keys), rows(keys, 8, seed=4))
    finally:
        session.close()


def test_a_dead_letter_too_large_to_send_whole_goes_without_its_payload(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    """A malformed message of almost 1 MB (the broker takes it) would be a dead letter over
    the producer's 1 MB limit with its headers: it goes without its payload, its size in a
    header, and the message after it is applied (the consumer had died on it, every start)."""
    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)
    n = (999_876 - 24) // (8 + 5 * 4)
    big = codec.encode(np.arange(n, dtype=np.int64), rows(np.arange(n), 5), 1)  # wrong dim
    good = np.arange(5, dtype=np.int64)
    try:
        with running(build_service(cfg, session)) as svc:
            with Publisher(kafka_broker.bootstrap, max_message_bytes=2_000_000) as pub:
                pub.produce_raw(codec.topic_name(model, "t0"), big, partition=0)
                pub.publish(model, "t0", good, rows(good, 4, seed=3))
            wait_for(lambda: svc.rows_applied >= good.size, 60, "the message after it applied")
            (letter,) = _read_topic(
                kafka_broker.bootstrap, cfg.update_source.hps_dead_letter_topic, 1
            )
        headers = dict(letter.headers())
        assert letter.value() is None and headers["hps_payload_bytes"] == str(len(big)).encode()
        assert headers["hps_reason"].decode().startswith("ShapeError")
        np.testing.assert_array_equal(session.lookup(f"{model}.t0", good), rows(good, 4, seed=3))
    finally:
        session.close()


@pytest.mark.parametrize(
    ("key_bytes", "payload_bytes", "carried"),
    [
        (600_000, 399_900, "key"),  # the letter keeps the key, leaves the payload out
        (999_700, 200, "neither"),  # the key alone fills the producer's limit
    ],
)
def test_a_dead_letter_with_a_large_key_stays_within_the_producers_limit(
    tmp_path: Path, kafka_broker: TansuBroker, key_bytes: int, payload_bytes: int, carried: str
) -> None:
    """A bad message whose key and payload together fill the producer's message.max.bytes
    (the broker took it): its dead letter, with its headers, went over that limit, the
    producer refused it, and the batch was retried for ever, nothing after it applied."""
    from confluent_kafka import Producer

    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)
    key, bad = b"k" * key_bytes, b"garbage!" + b"X" * (payload_bytes - 8)
    good = np.arange(5, dtype=np.int64)
    try:
        with running(build_service(cfg, session)) as svc:
            raw = Producer({"bootstrap.servers": kafka_broker.bootstrap})
            raw.produce(codec.topic_name(model, "t0"), bad, key, partition=0)
            assert raw.flush(30) == 0
            with Publisher(kafka_broker.bootstrap) as pub:
                pub.publish(model, "t0", good, rows(good, 4, seed=3))
            wait_for(lambda: svc.rows_applied >= good.size, 30, "the message after it applied")
            (letter,) = _read_topic(
                kafka_broker.bootstrap, cfg.update_source.hps_dead_letter_topic, 1
            )
        headers = dict(letter.headers())
        assert letter.value() is None
        assert headers["hps_payload_bytes"] == str(payload_bytes).encode()
        assert headers["hps_reason"].decode().startswith("DecodeError")
        if carried == "key":
            assert letter.key() == key and "hps_key_bytes" not in headers
        else:
            assert letter.key() is None and headers["hps_key_bytes"] == str(key_bytes).encode()
        np.testing.assert_array_equal(session.lookup(f"{model}.t0", good), rows(good, 4, seed=3))
    finally:
        session.close()

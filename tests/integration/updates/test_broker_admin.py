"""The control plane's admin client of the broker: a group's lag, the cluster's metadata,
one client for the life of the process, against a real broker (Tansu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from hps.build import build_session
from hps.errors import BackendUnavailable
from hps.testing.kafka import TansuBroker
from hps.updates import Publisher, codec
from hps.updates.broker_admin import BrokerAdmin
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_config, wait_for
from tests.helpers import rows

pytestmark = pytest.mark.integration


def test_the_lag_counts_what_a_group_has_not_committed(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    cfg = update_config(tmp_path, kafka_broker.bootstrap)
    model, group = cfg.models[0].model, cfg.update_source.hps_group_id
    topics = [codec.topic_name(model, "t0"), codec.topic_name(model, "t1")]
    session = build_session(cfg, with_cache=False)
    keys = np.arange(300, dtype=np.int64)
    admin = BrokerAdmin(kafka_broker.bootstrap)
    try:
        with Publisher(kafka_broker.bootstrap) as pub:
            for part in np.split(keys, 6):
                pub.publish(model, "t0", part, rows(part, 4, seed=1))
        # Offsets as the consumer's own watermarks give them (Tansu numbers record batches).
        watch = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "watch"})
        ends = [watch.get_watermark_offsets(TopicPartition(topics[0], p), 5) for p in range(8)]
        watch.close()
        unread = {p: hi - lo for p, (lo, hi) in enumerate(ends)}
        before = admin.group_lag(group, [*topics, "no.such.topic"])
        assert list(before) == [topics[0]]  # t1 got no message: no topic yet
        assert before[topics[0]] == unread and sum(unread.values()) > 0
        with running(build_service(cfg, session)) as svc:
            wait_for(lambda: svc.rows_applied >= keys.size, 60, "300 rows applied")
            wait_for(
                lambda: sum(admin.group_lag(group, topics)[topics[0]].values()) == 0,
                30,
                "the group's commits",
            )
        assert admin.group_lag("another", topics)[topics[0]] == unread
    finally:
        session.close()


def test_one_client_answers_every_question(kafka_broker: TansuBroker) -> None:
    admin = BrokerAdmin(kafka_broker.bootstrap)
    brokers, _ = admin.describe(5.0)
    assert brokers == 1
    client = admin._client
    assert client is not None
    admin.group_lag("g", ["no.such.topic"])
    assert admin.describe(5.0)[0] == 1 and admin._client is client


def test_an_unreachable_broker_is_a_clear_error() -> None:
    admin = BrokerAdmin("127.0.0.1:1")
    with pytest.raises(BackendUnavailable, match="cluster metadata"):
        admin.describe(1.0)

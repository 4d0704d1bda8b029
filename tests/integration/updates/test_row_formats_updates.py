"""Kafka updates to quantized tables (docs/config.md: hps_row_dtype): the wire stays float32,
the applier encodes per table, L2/L3 and a serving process's L1 hold the stored rows, and a
value a float16 table cannot hold goes to the dead-letter topic with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.config import parse_config
from hps.testing.kafka import TansuBroker
from hps.updates import Publisher
from hps.updates.runtime import build_service, start_updates
from tests.fixtures.kafka import running, update_doc, wait_for
from tests.helpers import cached_after_lookup
from tests.integration.updates.test_updates_flow import _read_topic

pytestmark = pytest.mark.integration


def test_updates_to_an_int8_table_are_served_quantized(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    doc = update_doc(tmp_path, kafka_broker.bootstrap, gpucache=True)
    doc["models"][0]["hps_row_dtype"] = ["int8", "float16"]
    cfg = parse_config(doc, "updates-test-ps.json")
    model = cfg.models[0].model
    t0 = f"{model}.t0"
    session = build_session(cfg)
    spec = session.tables[t0]
    keys = np.arange(32, dtype=np.int64)
    rng = np.random.default_rng(5)
    v1, v2 = (rng.standard_normal((keys.size, 4), dtype=np.float32) * s for s in (1, 50))
    handle = start_updates(session, cfg)  # hash_map L2: the embedded applier
    assert handle is not None
    try:
        with Publisher(kafka_broker.bootstrap) as pub:
            pub.publish(model, "t0", keys, v1)
            served = spec.fmt.decode(spec.fmt.encode(v1), 4)
            wait_for(lambda: np.array_equal(session.lookup(t0, keys), served), 30, "version 1")
            wait_for(lambda: cached_after_lookup(session, t0, keys), 10, "the keys in L1")
            np.testing.assert_array_equal(session.lookup(t0, keys), served)  # now from L1
            pub.publish(model, "t0", keys, v2)
            served = spec.fmt.decode(spec.fmt.encode(v2), 4)
            wait_for(lambda: np.array_equal(session.lookup(t0, keys), served), 10, "L1 update")
        got = session.lookup(t0, keys)
        half_step = (v2.max(axis=1) - v2.min(axis=1)) / 510
        assert (
            np.abs(got - v2) <= (half_step + 4 * np.spacing(np.abs(v2).max(axis=1)))[:, None]
        ).all()
        _, l1_rows = session.caches[t0].dump()
        assert l1_rows.dtype == np.uint8 and l1_rows.shape[1] == 4 + 8
        assert session.tiers.persistent is not None
        stored, found = session.tiers.persistent.fetch(t0, keys)
        assert found.all() and stored.dtype == np.uint8
        np.testing.assert_array_equal(stored, spec.fmt.encode(v2))
    finally:
        handle.stop()
        session.close()
    assert handle.error is None


def test_values_beyond_float16_go_to_the_dead_letter_topic(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    doc = update_doc(tmp_path, kafka_broker.bootstrap)
    doc["models"][0]["hps_row_dtype"] = ["int8", "float16"]
    cfg = parse_config(doc, "updates-test-ps.json")
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)
    keys = np.arange(10, dtype=np.int64)
    good = np.full((keys.size, 8), 65504.0, np.float32)  # float16's largest: kept
    try:
        with running(build_service(cfg, session)) as svc:
            with Publisher(kafka_broker.bootstrap) as pub:
                pub.publish(model, "t1", np.array([99], np.int64), np.full((1, 8), 7e4, np.float32))
                pub.publish(model, "t1", keys, good)
            wait_for(lambda: svc.rows_applied >= keys.size, 60, "the good rows applied")
            letters = _read_topic(
                kafka_broker.bootstrap, cfg.update_source.hps_dead_letter_topic, 1
            )
        reason = dict(letters[0].headers())["hps_reason"].decode()
        assert reason.startswith(
            f"InvalidValueError: {model}.t1: 8 value(s) outside float16's range"
        )
        np.testing.assert_array_equal(session.lookup(f"{model}.t1", keys), good)
        assert session.tiers.persistent is not None
        assert not session.tiers.persistent.fetch(f"{model}.t1", np.array([99]))[1].any()
    finally:
        session.close()

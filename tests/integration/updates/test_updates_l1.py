"""Serving processes see updates: the embedded applier and the L1 freshness listener."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.config import PSConfig
from hps.lookup import LookupSession
from hps.testing.kafka import TansuBroker
from hps.updates import Publisher
from hps.updates.runtime import build_service, start_updates
from tests.fixtures.kafka import running, update_config, wait_for
from tests.helpers import cached_after_lookup, rows

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("l3", ["disabled", "rocks_db"])
def test_embedded_applier_updates_l2_and_resident_l1(
    tmp_path: Path, kafka_broker: TansuBroker, l3: str
) -> None:
    """Embedded mode: the serving process applies updates itself (to L3 too when it writes it)."""
    persistent = {"type": l3, "path": str(tmp_path / "rocksdb")}
    cfg = update_config(tmp_path, kafka_broker.bootstrap, persistent=persistent, gpucache=True)
    model = cfg.models[0].model
    table = f"{model}.t0"
    session = build_session(cfg)
    keys = np.arange(64, dtype=np.int64)
    handle = start_updates(session, cfg)
    assert handle is not None and handle.thread.name == "hps-embedded-applier"
    try:
        with Publisher(kafka_broker.bootstrap) as pub:
            pub.publish(model, "t0", keys, rows(keys, 4, seed=1))
            wait_for(
                lambda: np.array_equal(session.lookup(table, keys), rows(keys, 4, seed=1)),
                30,
                "the first version to be served",
            )
            wait_for(lambda: cached_after_lookup(session, table, keys), 10, "the keys in L1")
            pub.publish(model, "t0", keys, rows(keys, 4, seed=2))
            wait_for(
                lambda: np.array_equal(session.lookup(table, keys), rows(keys, 4, seed=2)),
                10,
                "L1 to serve the second version",
            )
            pub.delete(model, "t0", keys[:8])
            wait_for(
                lambda: (session.lookup(table, keys[:8]) == 0.5).all(),
                10,
                "deleted keys to fall back to the default",
            )
            assert not session.caches[table].resident(keys[:8]).any()
        np.testing.assert_array_equal(session.lookup(table, keys[8:]), rows(keys[8:], 4, seed=2))
        if session.tiers.persistent is not None:  # deletes left L3 too; upserts reached it
            _, found = session.tiers.persistent.fetch(table, keys)
            assert found.tolist() == [False] * 8 + [True] * 56
    finally:
        handle.stop()
        session.close()
    assert handle.error is None and not handle.is_alive()


KEYS = np.arange(200, 264, dtype=np.int64)


def _shared_deployment(
    tmp_path: Path, kafka_broker: TansuBroker
) -> tuple[PSConfig, LookupSession, LookupSession]:
    """No L2: ``hps consume``'s session (it writes L3, which holds t1's KEYS at seed 1) and a
    serving one (an L3 secondary with L1s)."""
    cfg = update_config(
        tmp_path, kafka_broker.bootstrap, volatile={"type": "disabled"}, gpucache=True
    )
    writer = build_session(cfg, with_cache=False)
    writer.insert(f"{cfg.models[0].model}.t1", KEYS, rows(KEYS, 8, seed=1), durable=True)
    return cfg, writer, build_session(cfg, l3_mode="secondary")


def test_listener_refreshes_l1_of_a_shared_deployment(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    """``hps consume`` writes L3; a serving session (L3 secondary + L1) listens for changes."""
    cfg, writer, serving = _shared_deployment(tmp_path, kafka_broker)
    model = cfg.models[0].model
    table, keys = f"{model}.t1", KEYS
    handle = None
    try:
        np.testing.assert_array_equal(serving.lookup(table, keys), rows(keys, 8, seed=1))
        assert serving.caches[table].resident(keys).all()
        handle = start_updates(serving, cfg)
        assert handle is not None and handle.thread.name == "hps-l1-listener"
        with running(build_service(cfg, writer)) as svc, Publisher(kafka_broker.bootstrap) as pub:
            # The listener is positioned at the end of the topics when start_updates returns.
            pub.publish(model, "t1", keys, rows(keys, 8, seed=9))
            wait_for(
                lambda: np.array_equal(serving.lookup(table, keys), rows(keys, 8, seed=9)),
                10,
                "L1 to serve the new version",
            )
            pub.delete(model, "t1", keys[:4])
            wait_for(
                lambda: not serving.caches[table].resident(keys[:4]).any(),
                10,
                "deleted keys to leave L1",
            )
            wait_for(lambda: svc.rows_applied >= keys.size, 30, "the consumer to apply")
            # Pass 2 re-reads the keys from L3 once the consumer has committed past them.
            assert handle.refresher is not None
            wait_for(lambda: handle.refresher.pending == 0, 30, "the L1 re-read")  # type: ignore[union-attr]
        np.testing.assert_array_equal(serving.lookup(table, keys[4:]), rows(keys[4:], 8, seed=9))
        assert (serving.lookup(table, keys[:4]) == -1.0).all()  # the default of t1
    finally:
        if handle is not None:
            handle.stop()
        serving.close()
        writer.close()
    assert handle.error is None


@pytest.mark.parametrize("committed_before", [False, True])
def test_a_listener_started_while_hps_consume_lags_reads_what_it_has_not_applied(
    tmp_path: Path, kafka_broker: TansuBroker, committed_before: bool
) -> None:
    """An update published before the serving process (re)starts, applied after it has
    cached the old row from L3: its listener reads from the group's committed offsets (from
    the beginning where there are none), so L1 does not keep the old row (it did, for good:
    the listener began at the topics' end)."""
    cfg, writer, serving = _shared_deployment(tmp_path, kafka_broker)
    model = cfg.models[0].model
    table, keys = f"{model}.t1", KEYS
    handle = None
    try:
        with Publisher(kafka_broker.bootstrap) as pub:
            if committed_before:  # the group applied and committed something earlier
                with running(build_service(cfg, writer)) as svc:
                    pub.publish(model, "t0", keys[:4], rows(keys[:4], 4, seed=2))
                    wait_for(lambda: svc.rows_applied >= 4, 30, "the earlier update applied")
            pub.publish(model, "t1", keys, rows(keys, 8, seed=9))  # hps consume is down
        handle = start_updates(serving, cfg)  # the serving process starts
        assert handle is not None
        np.testing.assert_array_equal(serving.lookup(table, keys), rows(keys, 8, seed=1))
        with running(build_service(cfg, writer)) as svc:  # hps consume is back
            wait_for(lambda: svc.rows_applied >= keys.size, 30, "the consumer to apply")
            wait_for(
                lambda: np.array_equal(serving.lookup(table, keys), rows(keys, 8, seed=9)),
                20,
                "L1 to serve the update",
            )
    finally:
        if handle is not None:
            handle.stop()
        serving.close()
        writer.close()
    assert handle.error is None

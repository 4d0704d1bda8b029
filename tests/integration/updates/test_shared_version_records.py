"""Version records shared through Redis (hps.updates.shared_record): serving nodes publish
theirs, the consumer of a shared L2 with no L3 (``hps consume --versions-from-l2``, the Helm
chart's l2-updater) routes by their merge. Real Redis (one node and a Redis Cluster), a
real broker (Tansu) and ``hps consume`` as a process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hps.config import PSConfig, parse_config
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model
from hps.net import free_port
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.storage.redis_cluster import RedisStore
from hps.storage.rocks_db import RocksDBStore
from hps.testing.kafka import TansuBroker
from hps.tiers.node_records import NodeRecords
from hps.updates import Publisher
from hps.updates.shared_record import RecordFollower, RecordPublisher
from hps.versions import VersionRegistry
from hps.versions.node_record import FORGET_S, NodeRecord, node_name
from hps.versions.rollout import _marker, import_version, retire, version_entry
from hps.versions.shared_rows import release
from tests.fixtures.kafka import update_doc, wait_for
from tests.helpers import rows

pytestmark = pytest.mark.integration


def node_config(tmp_path: Path, name: str, doc: dict[str, Any]) -> PSConfig:
    """A serving node's ps.json: ``doc`` with an L3 of its own."""
    l3 = {"type": "rocks_db", "path": str(tmp_path / name / "l3")}
    (tmp_path / name).mkdir(exist_ok=True)
    return parse_config({**doc, "persistent_db": l3}, str(tmp_path / name / "ps.json"))


def l2_config(tmp_path: Path, doc: dict[str, Any]) -> Path:
    """The shared L2's consumer's ps.json: ``doc`` without an L3."""
    path = tmp_path / "l2" / "ps-l2.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**doc, "persistent_db": {"type": "disabled"}}))
    return path


def activate(config: PSConfig, version: int) -> None:
    """Record ``version`` of the model imported (ready) if it is not, and live."""
    registry = VersionRegistry(config)
    model = config.models[0]
    if version not in {v.version for v in registry.versions(model.model)}:
        registry.begin(model, version)
        registry.set_state(model.model, version, "ready")
    registry.set_live(model.model, version)


def states(config: PSConfig) -> dict[int, str]:
    registry = VersionRegistry(config)
    return {v.version: v.state for v in registry.versions(config.models[0].model)}


@pytest.fixture(params=["redis", "cluster"])
def address(request: pytest.FixtureRequest) -> str:
    name = "redis_address" if request.param == "redis" else "redis_cluster_address"
    return str(request.getfixturevalue(name))


def test_the_follower_merges_the_fresh_records_of_the_nodes(tmp_path: Path, address: str) -> None:
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": address})
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    path = l2_config(tmp_path, doc)
    l2 = parse_config(json.loads(path.read_text()), str(path))
    activate(a, 2)  # a: version 2 live, 1 kept; b: version 1 only (never versioned)
    pub_a, pub_b = RecordPublisher(a), RecordPublisher(b)
    follower = RecordFollower(l2, stale_s=1.0)
    try:
        pub_a.publish()
        pub_b.publish()
        assert follower.sync() and follower.nodes == 2
        assert states(l2) == {1: "live", 2: "live"}  # mid-rollout: both take untagged updates
        assert not follower.sync()  # nothing new: the record is not written again

        activate(b, 2)
        pub_b.publish()
        assert follower.sync()
        assert states(l2) == {1: "ready", 2: "live"}  # 1 is a kept rollback target now

        records = follower.records
        records.put("damaged", "{not json")
        records.put("long gone", NodeRecord(time.time() - 2 * FORGET_S, {}).encode())
        records.put("gone a while", NodeRecord(time.time() - 5, {}).encode())  # stale at once
        follower.sync()
        assert follower.nodes == 2  # the damaged one left out, the old one deleted
        assert set(records.all()) == {
            b"damaged", b"gone a while", node_name(pub_a.registry).encode(),
            node_name(pub_b.registry).encode()
        }  # fmt: skip

        activate(a, 1)  # a rolls back; it stops publishing (its control plane died)
        pub_a.publish()
        follower.sync()
        assert states(l2) == {1: "live", 2: "live"}
        wait_for(lambda: pub_b.publish() or (follower.sync() and follower.nodes == 1), 10,
                 "node a left out once its record went stale")  # fmt: skip
        assert states(l2) == {1: "ready", 2: "live"}  # b's alone
        time.sleep(1.2)  # b goes stale too: the last merge stands
        assert not follower.sync() and follower.nodes == 0
        assert states(l2) == {1: "ready", 2: "live"}
    finally:
        for part in (pub_a, pub_b, follower):
            part.close()


def test_a_control_plane_with_a_redis_l2_publishes_its_record(
    tmp_path: Path, redis_address: str
) -> None:
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": redis_address})
    config = node_config(tmp_path, "a", doc)
    state = AdminState(config, "t" * 32, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "admin")
    records = NodeRecords(config.volatile_db)
    field = node_name(VersionRegistry(config))

    def published() -> dict[int, str]:
        raw = records.get(field)
        if raw is None:
            return {}
        record = NodeRecord.decode(raw).models[config.models[0].model]
        return {n: v.state for n, v in record.versions.items()}

    try:
        with TestClient(create_app(state)):
            wait_for(lambda: published() == {1: "live"}, 20, "the record published")
            activate(config, 2)
            wait_for(lambda: published() == {1: "ready", 2: "live"}, 20, "the change published")
    finally:
        records.close()


@contextmanager
def consuming(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``hps consume --versions-from-l2`` as a process; SIGTERM at the end (exit 0)."""
    hps = Path(sys.executable).with_name("hps")
    args = [str(hps), "consume", "--config", str(config), "--versions-from-l2",
            "--metrics-port", str(free_port())]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        assert code == 0, log.read_text()[-3000:]


def test_the_shared_l2_takes_the_updates_of_the_versions_the_nodes_keep(
    tmp_path: Path, redis_address: str, kafka_broker: TansuBroker
) -> None:
    """A node with version 2 live: untagged updates reach version 2's rows in Redis, not
    version 1's. A second node mid-rollout (1 live, 2 ready): they reach both. Once both
    retired version 1, the consumer drops what it wrote there."""
    doc = update_doc(tmp_path, kafka_broker.bootstrap,
                     volatile={"type": "redis", "address": redis_address})  # fmt: skip
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    model = a.models[0]
    v1, v2 = model.at_version(1).tables[0], model.at_version(2).tables[0]
    activate(a, 2)
    RecordPublisher(a).publish()
    store = RedisStore.from_config(a.volatile_db)
    for spec in (v1, v2):
        store.open_table(spec)

    def holds(spec: Any, keys: np.ndarray, seed: int) -> bool:
        values, found = store.fetch(spec.name, keys)
        return bool(found.all()) and np.array_equal(np.asarray(values), rows(keys, 4, seed))

    first, second = np.arange(0, 64, dtype=np.int64), np.arange(64, 128, dtype=np.int64)
    log = tmp_path / "consume.log"
    try:
        with consuming(l2_config(tmp_path, doc), log), Publisher(kafka_broker.bootstrap) as pub:
            pub.publish(model.model, "t0", first, rows(first, 4, seed=1))
            pub.flush()
            wait_for(lambda: holds(v2, first, 1), 60, f"version 2 updated ({log})")
            activate(b, 1)  # b joins: version 1 live, version 2 imported, not activated
            registry = VersionRegistry(b)
            registry.begin(model, 2)
            registry.set_state(model.model, 2, "ready")
            RecordPublisher(b).publish()
            routed = f"version record: {model.model}: 1 live, 2 live"  # the loop's reading
            wait_for(lambda: routed in log.read_text(), 30, "the merge read by the consumer")
            pub.publish(model.model, "t0", second, rows(second, 4, seed=2))
            pub.flush()
            wait_for(lambda: holds(v1, second, 2) and holds(v2, second, 2), 60,
                     "both versions updated")  # fmt: skip
            assert not store.fetch(v1.name, first)[1].any()  # version 1 never took the first
            for node in (a, b):  # each retires 1; their drops ran before the consumer knew
                activate(node, 2)
                VersionRegistry(node).set_state(model.model, 1, "retired")
                RecordPublisher(node).publish()
            wait_for(lambda: not store.fetch(v1.name, second)[1].any(), 30,
                     "the consumer dropped what it wrote into retired version 1")  # fmt: skip
        assert holds(v2, second, 2)
    finally:
        store.close()


def test_a_second_nodes_import_of_a_version_keeps_what_the_shared_l2_holds(
    tmp_path: Path, redis_address: str
) -> None:
    """Node a imports version 2 and an update reaches its rows in Redis; node b's import of
    the same version then fills only what Redis lacks: the update is not reverted. Rows no
    node holds whole (a failed import's) are overwritten."""
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": redis_address})
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    keys = np.arange(100, dtype=np.int64)
    files = []
    for table, dim in (("t0", 4), ("t1", 8)):
        write_sparse_model(tmp_path / "v2" / table, keys, rows(keys, dim, seed=3))
        files.append(str(tmp_path / "v2" / table))
    import_version(a, version_entry(a, a.models[0].model, sparse_files=files), 2)
    spec = a.models[0].at_version(2).tables[0]
    store = RedisStore.from_config(a.volatile_db)
    try:
        store.open_table(spec)
        assert np.array_equal(np.asarray(store.fetch(spec.name, keys)[0]), rows(keys, 4, seed=3))
        store.insert(spec.name, keys[:5], rows(keys[:5], 4, seed=9))  # an update since
        store.remove(spec.name, keys[90:])  # evicted since
        publisher = RecordPublisher(a)
        publisher.publish()  # a holds version 2 whole
        publisher.close()
        import_version(b, version_entry(b, b.models[0].model, sparse_files=files), 2)
        got, found = store.fetch(spec.name, keys)
        assert found.all()
        assert np.array_equal(np.asarray(got)[:5], rows(keys[:5], 4, seed=9))
        assert np.array_equal(np.asarray(got)[5:], rows(keys[5:], 4, seed=3))

        c = node_config(tmp_path, "c", doc)  # version 3: rows left by an import that failed
        spec_3 = c.models[0].at_version(3).tables[0]
        store.open_table(spec_3)
        store.insert(spec_3.name, keys, rows(keys, 4, seed=7))
        import_version(c, version_entry(c, c.models[0].model, sparse_files=files), 3)
        got, found = store.fetch(spec_3.name, keys)
        assert found.all() and np.array_equal(np.asarray(got), rows(keys, 4, seed=3))
    finally:
        store.close()


def test_a_retire_keeps_the_shared_rows_of_a_version_another_node_holds(
    tmp_path: Path, address: str
) -> None:
    """Nodes a and b both hold version 2. a retires it: its L3's rows go, Redis's stay for
    b. b retires it: no node holds it any more, Redis's go. a's next publish clears its
    record of the kept rows."""
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": address})
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    keys = np.arange(50, dtype=np.int64)
    files = []
    for table, dim in (("t0", 4), ("t1", 8)):
        write_sparse_model(tmp_path / "v2" / table, keys, rows(keys, dim, seed=3))
        files.append(str(tmp_path / "v2" / table))
    model = a.models[0].model
    for node in (a, b):
        import_version(node, version_entry(node, model, sparse_files=files), 2)
    spec = a.models[0].at_version(2).tables[0]
    pub_a, pub_b = RecordPublisher(a), RecordPublisher(b)
    store = RedisStore.from_config(a.volatile_db)

    def in_l3(node: PSConfig) -> bool:
        l3 = RocksDBStore(str(node.persistent_db.path), mode="read_only")
        try:
            return spec.name in l3.column_families
        finally:
            l3.close()

    def in_redis() -> bool:
        store.open_table(spec)
        return bool(store.fetch(spec.name, keys)[1].all())

    def files(node: PSConfig) -> bool:  # the version's files on the node (its import's marker)
        return _marker(node, model, 2).exists()

    try:
        pub_a.publish()
        pub_b.publish()
        retire(a, model, 2)
        info = VersionRegistry(a).get(model, 2)
        assert (info.state, info.shared_rows_left) == ("retired", True)
        assert not in_l3(a) and in_l3(b)  # a's own copy dropped
        assert in_redis()  # b's lookups of version 2 still hit Redis
        assert files(a)  # kept with the rows kept for b
        pub_a.publish()  # b still holds it: nothing released
        assert in_redis() and VersionRegistry(a).get(model, 2).shared_rows_left and files(a)

        retire(b, model, 2)  # a's record says retired: b is the last, Redis's rows go
        assert not VersionRegistry(b).get(model, 2).shared_rows_left and not in_l3(b)
        assert not in_redis() and not files(b)
        store.insert(spec.name, keys[:1], rows(keys[:1], 4, seed=5))  # (dropped again below)
        pub_b.publish()
        pub_a.publish()  # nobody holds it: a drops what is left and clears its flag
        assert not in_redis() and not VersionRegistry(a).get(model, 2).shared_rows_left
        assert not files(a)  # its files went with its last rows
    finally:
        for part in (pub_a, pub_b):
            part.close()
        store.close()


def test_a_nodes_refused_import_of_a_version_leaves_another_nodes_rows(
    tmp_path: Path, redis_address: str
) -> None:
    """a imports version 2 in other dims than b asks for, and publishes no record: b's
    import is refused (saying why) and its clean-up leaves a's rows in Redis."""
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": redis_address})
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    keys = np.arange(30, dtype=np.int64)
    files = {}
    for dims in ((4, 8), (16, 32)):
        for table, dim in zip(("t0", "t1"), dims, strict=True):
            write_sparse_model(tmp_path / f"d{dim}" / table, keys, rows(keys, dim, seed=dim))
        files[dims] = [str(tmp_path / f"d{d}" / t) for t, d in zip(("t0", "t1"), dims, strict=True)]
    model = a.models[0].model
    entry_a = version_entry(a, model, sparse_files=files[16, 32], dims=[16, 32])
    import_version(a, entry_a, 2)
    with pytest.raises(ConfigError, match="import it with the same dims and row formats"):
        import_version(b, version_entry(b, model, sparse_files=files[4, 8]), 2)
    store = RedisStore.from_config(a.volatile_db)
    try:
        for spec in entry_a.at_version(2).tables:
            store.open_table(spec)
            values, found = store.fetch(spec.name, keys)
            assert found.all() and np.array_equal(
                np.asarray(values), rows(keys, spec.dim, spec.dim)
            )
    finally:
        store.close()


def test_a_version_whose_rows_cannot_be_released_holds_up_no_other(
    tmp_path: Path, redis_address: str
) -> None:
    """Versions 2 and 3 wait for their shared rows to be dropped; version 2's recorded
    entry is one this release refuses: version 3's rows are dropped all the same."""
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": redis_address})
    a = node_config(tmp_path, "a", doc)
    model = a.models[0]
    registry = VersionRegistry(a)
    store = RedisStore.from_config(a.volatile_db)
    keys = np.arange(10, dtype=np.int64)
    try:
        for n in (2, 3):
            registry.begin(model, n)
            registry.set_state(model.model, n, "retired", shared_rows_left=True)
            spec = model.at_version(n).tables[0]
            store.open_table(spec)
            store.insert(spec.name, keys, rows(keys, 4))
        with registry.editing() as record:  # as a later release might have written it
            record[model.model]["versions"]["2"]["entry"]["hps_a_later_option"] = 1  # type: ignore[index]
        assert release(a) == [(model.model, 3)]
        assert [v.version for _, v in registry.shared_rows_left()] == [2]
        v2, v3 = (model.at_version(n).tables[0].name for n in (2, 3))
        assert store.fetch(v2, keys)[1].all() and not store.fetch(v3, keys)[1].any()
    finally:
        store.close()

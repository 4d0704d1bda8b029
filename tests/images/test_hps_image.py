"""The HPS image runs ``hps consume`` against a Tansu broker and a redis-server started on the
host: an update published from the host lands in Redis (L2) and in RocksDB (L3, a mounted
folder), its heartbeat passes `hps consume-check` inside the container, and SIGTERM ends the
consumer with exit code 0."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hps.config import load_config
from hps.storage.redis_cluster import RedisStore
from hps.storage.rocks_db import RocksDBStore
from hps.testing.kafka import TansuBroker
from hps.types import TableSpec
from hps.updates import Publisher
from tests.fixtures.kafka import update_doc, wait_for
from tests.images.conftest import GRACE_S, UID, Containers
from tests.images.podman import Podman
from tests.images.test_serving_image import LOCKED_DOWN

pytestmark = pytest.mark.integration

CONSUME_COMMAND = ["consume", "--config"]  # + ps.json, as docker/compose.yaml runs it
HEARTBEAT = "/tmp/hps-consume.heartbeat"  # compose.yaml's health check reads it


def test_hps_image_consumes_updates_into_redis_and_rocksdb(
    podman: Podman,
    hps_image: str,
    containers: Containers,
    kafka_broker: TansuBroker,
    redis_address: str,
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    redis = {"type": "redis", "address": redis_address}
    doc = update_doc(data, kafka_broker.bootstrap, volatile=redis)
    model = doc["models"][0]["model"]
    ps = data / "ps.json"
    ps.write_text(json.dumps(doc))
    for path in (tmp_path, data, ps):
        os.chown(path, UID, UID)
    config = load_config(ps)
    keys = np.array([3, -5, 1 << 40], dtype=np.int64)
    values = np.arange(keys.size * 4, dtype=np.float32).reshape(-1, 4) / 7
    publisher = Publisher(kafka_broker.bootstrap)
    publisher.publish(model, "t0", keys[:1], values[:1], version=1)  # creates the topic
    publisher.flush()

    name = containers.name("consume")
    podman.run(
        "run",
        "--detach",
        "--name",
        name,
        "--network=host",
        *LOCKED_DOWN,
        "--volume",
        f"{data}:{data}",
        hps_image,
        *CONSUME_COMMAND,
        str(ps),
        "--heartbeat-file",
        HEARTBEAT,
    )
    publisher.publish(model, "t0", keys, values, version=2)
    publisher.close()

    spec = TableSpec(model, "t0", 4)
    l2 = RedisStore.from_config(config.volatile_db)
    l2.open_table(spec)

    def in_l2() -> bool:
        got, found = l2.fetch(spec.name, keys)
        return bool(found.all() and np.array_equal(got, values))

    wait_for(in_l2, 90, f"the update in Redis; consumer log:\n{containers.logs(name)[-3000:]}")
    l2.close()
    check = ["exec", name, "hps", "consume-check", "--heartbeat-file", HEARTBEAT]
    done = podman.run(*check, check=False)
    assert done.returncode == 0, done.stderr

    podman.run("stop", "--time", str(GRACE_S), name, timeout=GRACE_S + 30)
    code = podman.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    # 0, not 137: it ended on SIGTERM within the grace period, before podman's SIGKILL.
    assert code == "0", containers.logs(name)[-3000:]

    l3 = RocksDBStore(doc["persistent_db"]["path"], mode="read_only")
    l3.open_table(spec)
    try:
        got, found = l3.fetch(spec.name, keys)
        assert found.all()
        np.testing.assert_array_equal(got, values)
    finally:
        l3.close()

"""The Kafka broker (Tansu) restarted mid-stream: nothing lost, nothing applied twice wrongly.

Tansu keeps its log in S3 here (moto's S3 server on loopback), so a restarted broker has
the topics, messages and committed offsets it had. A consumer (the ``hps consume`` loop,
in a thread, Redis-free: RocksDB L3) and a publisher run through a broker restart (SIGTERM
and start on the same port); afterwards L3 is exactly the published stream and the group's
committed offsets are the topic's end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.net import free_port
from hps.testing.kafka import TansuBroker
from hps.updates import Publisher, codec
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_config, wait_for
from tests.integration.faults.consume_stream import (
    PARTITIONS,
    SENTINELS,
    TopicReader,
    committed,
    expected,
    step,
)

pytestmark = pytest.mark.integration

AWS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """moto's S3 server on a free loopback port with a bucket ``tansu``; stopped by PID."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "moto.log", "wb") as log:
        moto = str(Path(sys.executable).with_name("moto_server"))
        proc = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def bucket() -> bool:
            try:
                req = urllib.request.Request(f"{url}/tansu", method="PUT")
                return urllib.request.urlopen(req, timeout=2).status == 200
            except OSError:
                return False

        wait_for(bucket, 60, "moto's S3 server")
        yield url
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)


def test_broker_restart_mid_stream_loses_nothing(tmp_path: Path, s3_endpoint: str) -> None:
    env = {**AWS, "AWS_ENDPOINT": s3_endpoint}
    broker = TansuBroker(tmp_path / "tansu", storage_engine="s3://tansu/", env=env)
    broker.start()
    try:
        _run(tmp_path, broker)
    finally:
        broker.stop()


def _run(tmp_path: Path, broker: TansuBroker) -> None:
    brokers = broker.bootstrap
    cfg = update_config(
        tmp_path, brokers, volatile={"type": "disabled"}, max_batch_size=40, failure_backoff_ms=50
    )
    model = cfg.models[0].model
    table = f"{model}.t0"
    topic = codec.topic_name(model, "t0")
    group = cfg.update_source.hps_group_id
    stream: list = []
    session = build_session(cfg, with_cache=False)
    rng = np.random.default_rng(9)
    try:
        with (
            running(build_service(cfg, session)),
            Publisher(brokers, num_partitions=PARTITIONS) as pub,
        ):

            def publish(i: int) -> None:
                for kind, keys, vals in step(rng, i):
                    if kind == "delete":
                        pub.delete(model, "t0", keys)
                    else:
                        pub.publish(model, "t0", keys, vals)
                    stream.append((kind, keys, vals))

            for i in range(40):
                publish(i)
            pub.flush()
            wait_for(lambda: _holds(session, table, expected(stream)), 60, "the first steps")
            broker.stop()  # SIGTERM mid-stream; the publisher keeps producing into its buffer
            restarted_at = time.monotonic()
            for i in range(40, 60):
                publish(i)
            time.sleep(1.0)
            broker.start()
            for i in range(60, 100):
                publish(i)
            pub.flush(60)
            wait_for(lambda: _holds(session, table, expected(stream)), 90, "every step applied")
            caught_up = time.monotonic() - restarted_at
            reader = TopicReader(brokers, topic)
            ends = {p: 0 for p in range(PARTITIONS)} | {
                m.partition(): m.offset() + 1  # type: ignore[attr-defined]
                for m in reader.all()
            }
            reader.close()
            # the running consumer commits whatever it stored when a poll finds nothing
            wait_for(lambda: committed(brokers, group, topic) == ends, 60, "commits at the end")
    finally:
        session.close()
    print(
        f"\nbroker restarted after step 40 of 100: L3 exact ({len(expected(stream))} keys) "
        f"{caught_up:.1f}s after the restart began; committed offsets == end offsets {ends}"
    )
    assert SENTINELS.shape[1] >= 100


def _holds(session, table: str, want: dict) -> bool:  # type: ignore[no-untyped-def,type-arg]
    l3 = session.tiers.persistent
    keys = np.array(sorted(want), dtype=np.int64)
    values, found = l3.fetch(table, keys)
    if not (found.all() and np.array_equal(values, np.stack([want[k] for k in keys.tolist()]))):
        return False
    return bool(l3.size(table) == len(want))

"""``hps consume`` as a process: SIGKILL mid-stream and a restart end in exactly the expected
state; SIGTERM exits 0 with every applied offset committed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from hps.net import free_port
from hps.storage.rocks_db import RocksDBStore
from hps.testing.kafka import TansuBroker
from hps.types import TableSpec
from hps.updates import Publisher, codec
from hps.updates.partition import partition_of
from tests.fixtures.kafka import update_doc, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 4
AFTER_KILL = 30  # steps published after the kill
MARKER = 10**12  # keys from here on mark the end of the stream, one per partition


class ConsumeProcess:
    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port()
        hps = Path(sys.executable).with_name("hps")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(hps), "consume", "--config", str(config), "--metrics-port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def metrics(self, prefix: str) -> dict[str, float]:
        """Samples of the metrics named ``prefix{...}`` (empty until the endpoint is up)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=1) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {
            name: float(value)
            for name, value in (line.rsplit(" ", 1) for line in text.splitlines())
            if name.startswith(prefix + "{")
        }

    def applied_rows(self) -> float:
        return sum(self.metrics("hps_updates_applied_rows_total").values())

    def signal(self, sig: int) -> int:
        os.kill(self.proc.pid, sig)
        return self.proc.wait(30)


def _step(rng: np.random.Generator, step: int) -> tuple[str, np.ndarray, np.ndarray | None]:
    """Upserts of overlapping keys, with deletes mixed in."""
    keys = rng.choice(400, size=60, replace=False).astype(np.int64)
    if step % 7 == 6:
        return ("delete", keys[:15], None)
    vals = (keys[:, None] * 0.001 + step + np.arange(4)[None, :]).astype(np.float32)
    return ("upsert", keys, vals)


def _expected(stream: list[tuple[str, np.ndarray, np.ndarray | None]]) -> dict[int, np.ndarray]:
    state: dict[int, np.ndarray] = {}
    for kind, keys, vals in stream:
        for i, k in enumerate(keys.tolist()):
            if kind == "delete":
                state.pop(k, None)
            else:
                assert vals is not None
                state[k] = vals[i]
    return state


def _markers() -> np.ndarray:
    cand = np.arange(MARKER, MARKER + 1000, dtype=np.int64)
    parts = partition_of(cand, PARTITIONS)
    return np.array([cand[parts == p][0] for p in range(PARTITIONS)], dtype=np.int64)


def _end_offsets(brokers: str, topic: str) -> dict[int, int]:
    """Next offset of every partition, found by reading it (Tansu's watermarks lag)."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "counter", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    ends: dict[int, int] = {}
    idle, deadline = 0, time.monotonic() + 30
    while idle < 5:  # quiet polls count once every partition (each has a marker) was seen
        msgs = c.consume(500, 0.3)
        assert time.monotonic() < deadline, f"only partitions {sorted(ends)} read"
        idle = 0 if msgs or len(ends) < PARTITIONS else idle + 1
        for m in msgs:
            ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
    c.close()
    return ends


def _committed(brokers: str, group: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
    got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    c.close()
    return {tp.partition: tp.offset for tp in got}


def test_sigkill_mid_stream_then_restart_gives_exact_state(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    doc = update_doc(tmp_path, kafka_broker.bootstrap, max_batch_size=60, max_commit_interval=3)
    doc["volatile_db"] = {"type": "disabled"}
    model = doc["models"][0]["model"]
    config = tmp_path / "ps.json"
    config.write_text(json.dumps(doc))
    topic = codec.topic_name(model, "t0")
    stream: list[tuple[str, np.ndarray, np.ndarray | None]] = []
    log = tmp_path / "consume.log"

    pub = Publisher(kafka_broker.bootstrap, num_partitions=PARTITIONS)
    pub.publish(model, "t0", np.array([0]), np.zeros((1, 4), np.float32), version=1)  # topic
    pub.flush()
    first = ConsumeProcess(config, log)
    killed = threading.Event()

    def produce() -> None:
        rng = np.random.default_rng(7)
        remaining = AFTER_KILL
        while remaining and len(stream) < 5000:
            kind, keys, vals = _step(rng, len(stream))
            if kind == "delete":
                pub.delete(model, "t0", keys)
            else:
                pub.publish(model, "t0", keys, vals)
            pub.flush()
            stream.append((kind, keys, vals))
            remaining -= killed.is_set()
            time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    wait_for(lambda: first.applied_rows() > 0, 60, f"first consumer to apply ({log})")
    assert first.signal(signal.SIGKILL) == -signal.SIGKILL  # mid-stream: still publishing
    killed.set()
    producer.join(60)
    markers = _markers()
    pub.publish(model, "t0", markers, np.full((markers.size, 4), 7.0, np.float32))
    pub.close()

    second = ConsumeProcess(config, log)
    spec = TableSpec(model, "t0", 4)
    reader = RocksDBStore(doc["persistent_db"]["path"], mode="secondary")
    reader.open_table(spec)

    def markers_applied() -> bool:
        reader.catch_up()
        reader.open_table(spec)
        return bool(reader.fetch(spec.name, markers)[1].all())

    wait_for(markers_applied, 60, f"the restarted consumer to reach the end ({log})")
    lag = wait_for(lambda: second.metrics("hps_updates_consumer_lag"), 10, "the lag metric")
    assert any(f'topic="{topic}"' in name for name in lag)
    assert second.signal(signal.SIGTERM) == 0
    reader.close()

    assert _committed(kafka_broker.bootstrap, doc["update_source"]["hps_group_id"], topic) == (
        _end_offsets(kafka_broker.bootstrap, topic)
    )
    expected = _expected([("upsert", np.array([0]), np.zeros((1, 4), np.float32)), *stream])
    for k in markers.tolist():
        expected[k] = np.full(4, 7.0, np.float32)
    store = RocksDBStore(doc["persistent_db"]["path"], mode="read_only")
    store.open_table(spec)
    try:
        keys = np.array(sorted(expected), dtype=np.int64)
        values, found = store.fetch(spec.name, keys)
        assert found.all()
        np.testing.assert_array_equal(values, np.stack([expected[k] for k in keys.tolist()]))
        assert store.size(spec.name) == len(expected)  # deleted keys are gone
    finally:
        store.close()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]

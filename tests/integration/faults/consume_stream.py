"""Shared pieces of the update fault tests: a checkable update stream, a consumer process.

Every step of the stream upserts (or deletes) overlapping keys, plus one *sentinel* key per
Kafka partition that no other step touches. Each message therefore carries exactly one
sentinel: finding it in a store proves that message was applied, which is how the tests
check that committed offsets are never ahead of what was applied.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from hps.updates.partition import partition_of

PARTITIONS = 4
DIM = 4
SENTINEL_BASE = 10**12

Step = tuple[str, np.ndarray, np.ndarray | None]


def _sentinel_pool() -> np.ndarray:
    cand = np.arange(SENTINEL_BASE, SENTINEL_BASE + 200_000, dtype=np.int64)
    parts = partition_of(cand, PARTITIONS)
    per = min(int((parts == p).sum()) for p in range(PARTITIONS))
    return np.stack([cand[parts == p][:per] for p in range(PARTITIONS)])  # [partition, i]


SENTINELS = _sentinel_pool()


def step(rng: np.random.Generator, i: int) -> list[Step]:
    """Step ``i``: an upsert or delete of 60 overlapping keys, then the step's sentinels."""
    keys = rng.choice(400, size=60, replace=False).astype(np.int64)
    sentinels = SENTINELS[:, i]
    svals = np.full((PARTITIONS, DIM), float(i), np.float32)
    if i % 7 == 6:
        return [("delete", keys[:15], None), ("upsert", sentinels, svals)]
    vals = (keys[:, None] * 0.001 + i + np.arange(DIM)[None, :]).astype(np.float32)
    return [("upsert", np.concatenate([keys, sentinels]), np.concatenate([vals, svals]))]


def expected(stream: Iterable[Step]) -> dict[int, np.ndarray]:
    state: dict[int, np.ndarray] = {}
    for kind, keys, vals in stream:
        if kind == "delete":
            for k in keys.tolist():
                state.pop(k, None)
        else:
            assert vals is not None
            state.update(zip(keys.tolist(), vals, strict=True))
    return state


class Launcher:
    """Starts ``hps consume`` processes through tests/integration/faults/zygote.py."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("zygote.py"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self._ask(None) == "ready"

    def _ask(self, cmd: dict[str, object] | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if cmd is not None:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def consume(self, config: Path, log: Path, *extra: str) -> int:
        """Start ``hps consume --config CONFIG EXTRA...``; its PID."""
        argv = ["consume", "--config", str(config), *extra]
        return int(self._ask({"run": argv, "log": str(log)}))

    def stop(self, pid: int, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` and wait: the exit code, or ``-signal`` when the signal killed it."""
        os.kill(pid, sig)
        return int(self._ask({"wait": pid}))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def applied_rows(port: int) -> float:
    """``hps_updates_applied_rows_total`` summed, from ``hps consume --metrics-port``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hps_updates_applied_rows_total{")
    )


class TopicReader:
    """Reads a topic from the beginning, keeping what it read (no consumer group)."""

    def __init__(self, brokers: str, topic: str) -> None:
        self.c = Consumer(
            {"bootstrap.servers": brokers, "group.id": "reader", "enable.auto.commit": False}
        )
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.read: list[object] = []
        self.ends = dict.fromkeys(range(PARTITIONS), 0)  # next offset per partition

    def below(self, offsets: dict[int, int]) -> list[object]:
        """The messages at offsets < ``offsets[partition]`` (waits until they are read)."""
        deadline = time.monotonic() + 30
        while any(self.ends[p] < offsets.get(p, 0) for p in self.ends):
            assert time.monotonic() < deadline, f"cannot read up to {offsets}: {self.ends}"
            self._poll()
        return [m for m in self.read if m.offset() < offsets.get(m.partition(), 0)]  # type: ignore[attr-defined]

    def all(self) -> list[object]:
        """Everything, once the topic has stayed quiet for four polls after the first message
        (a fresh reader on a loaded machine may see nothing for a while)."""
        deadline, idle = time.monotonic() + 30, 0
        while idle < 4:
            if self._poll():
                idle = 0
            elif self.read or time.monotonic() > deadline:
                idle += 1
        return self.read

    def _poll(self) -> int:
        got = [m for m in self.c.consume(500, 0.3) if m.error() is None]
        for m in got:
            self.ends[m.partition()] = max(self.ends[m.partition()], m.offset() + 1)
        self.read += got
        return len(got)

    def close(self) -> None:
        self.c.close()


def committed(brokers: str, group: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
    got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    c.close()
    return {tp.partition: max(tp.offset, 0) for tp in got}


def sentinels_of(msgs: Iterable[object]) -> np.ndarray:
    """The sentinel key each upsert message carries (deletes carry none)."""
    from hps.updates import codec

    out = []
    for m in msgs:
        d = codec.decode(m.value())  # type: ignore[attr-defined]
        if d.delete:
            continue
        s = d.keys[d.keys >= SENTINEL_BASE]
        assert s.size == 1, f"message without exactly one sentinel: {s}"
        out.append(int(s[0]))
    return np.array(out, dtype=np.int64)

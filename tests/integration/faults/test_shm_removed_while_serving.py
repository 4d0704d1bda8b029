"""The shared-memory L2's files removed while serving, with Kafka updates flowing
(docs/multi_process_hash_map.md, "Files removed or replaced under running processes").

Real parts: the Kafka-protocol broker (Tansu), ``hps consume`` as a process (it writes
RocksDB L3 and the node's ``multi_process_hash_map`` L2), ``hps serve`` as a process with
two Triton instances of one model reading that L2 (no L1: every answer comes from L2, or L3
on a miss). A publisher changes the rows of 32 keys round after round (column 0 of a row is
its round); it counts a round as *confirmed* once ``hps consume`` reports it applied (its
``hps_updates_applied_rows_total``, counted once a batch is in L3 and then L2).

A *stale* answer: a row of an older round than the one confirmed before the request was
sent (L3 held at least that round then). While the rounds flow, the segment's files under
``/dev/shm`` (the segment, ``.lock``, ``.users``, ``.turn``) are removed. Then, within a hang guard,
every process is on the one new segment (its header counts as many users as the old one
had and records a fill from L3) and both instances answer the confirmed round; after that
point, over a checking window of further rounds, 0 stale answers. Keys no round touches
answer their original rows from the refilled segment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model
from hps.net import free_port
from hps.storage._shm_layout import HeaderWord
from hps.storage._shm_segment import path_identity
from hps.testing.kafka import TansuBroker
from hps.triton.client import Client
from hps.updates import Publisher
from hps.updates.journal import Journal, journal_dir
from tests.fixtures.kafka import update_source_doc, wait_for
from tests.integration.faults.consume_stream import applied_rows

pytestmark = pytest.mark.integration

HPS = [sys.executable, "-m", "hps.cli"]
ROWS, DIM, HOT = 400, 8, 32  # keys, dimension, keys the rounds change (the first HOT)
WINDOW_ROUNDS = 12  # rounds confirmed during the checking window


def _rows(round_: int, index: np.ndarray) -> np.ndarray:
    """Column 0: the round; the rest: which key (its index), so a wrong row shows too."""
    out = np.empty((index.size, DIM), np.float32)
    out[:, 0] = round_
    out[:, 1:] = index[:, None] + 0.5
    return out


def _doc(root: Path, model: str, shm: str, brokers: str) -> dict[str, object]:
    source = update_source_doc(brokers, model)
    return {
        "models": [
            {
                "model": model,
                "sparse_files": [str(root / "tables" / "u")],
                "embedding_table_names": ["u"],
                "embedding_vecsize_per_table": [DIM],
                "maxnum_catfeature_query_per_table_per_sample": [HOT],
                "max_batch_size": 16,
                "gpucache": False,  # answers from the shared L2 (or L3): what is tested
                "hps_instances": 2,
            }
        ],
        "volatile_db": {
            "type": "multi_process_hash_map",
            "shared_memory_name": shm,
            "shared_memory_size": 64 * 1024**2,
            "allocation_rate": 4 * 1024**2,
        },
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
        "update_source": source,
    }


def _header(path: str, word: HeaderWord) -> int:
    """One header word of the segment file at ``path`` (-1: no file there)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return -1
    try:
        raw = os.pread(fd, 8, 8 * int(word))
    finally:
        os.close(fd)
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 8 else -1


def _requests_per_process(metrics_url: str, model: str) -> dict[str, float]:
    """``hps_requests_total`` of each serving process of ``model`` (Triton's /metrics)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if line.startswith("hps_requests_total{") and f'model="{model}"' in line:
            labels, value = line.rsplit(" ", 1)
            process = labels.split('process="', 1)[1].split('"', 1)[0]
            out[process] += float(value)
    return out


class Rounds:
    """Publishes round after round of the HOT keys; ``confirmed``: the last one applied."""

    def __init__(self, brokers: str, model: str, metrics_port: int, keys: np.ndarray) -> None:
        self.pub = Publisher(brokers, num_partitions=1)  # one partition: rounds in order
        self.model, self.port, self.keys = model, metrics_port, keys
        self.confirmed = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Rounds:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            index = np.arange(self.keys.size)
            r = 0
            while not self._stop.is_set():
                r += 1
                self.pub.publish(self.model, "u", self.keys, _rows(r, index))
                self.pub.flush()
                want = r * self.keys.size
                wait_for(lambda w=want: applied_rows(self.port) >= w, 120, f"round {r} applied")
                self.confirmed = r
                self._stop.wait(0.05)
        except BaseException as exc:
            self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(150)
        self.pub.close()
        assert not self.errors, self.errors


def _ask(url: str, model: str, rounds: Rounds | None, keys: np.ndarray) -> tuple[int, np.ndarray]:
    """(round confirmed before the request was sent, the rows answered)."""
    ref = 0 if rounds is None else rounds.confirmed
    with Client(url) as client:
        got = client.lookup(model, keys, np.array([keys.size], np.int32))
    return ref, got.reshape(keys.size, DIM)


def _batch(
    url: str, model: str, rounds: Rounds | None, keys: np.ndarray
) -> list[tuple[int, np.ndarray]]:
    """Eight concurrent requests (both instances get some)."""
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_ask, url, model, rounds, keys) for _ in range(8)]
        return [f.result() for f in futures]


def _wait_line(proc: subprocess.Popen[bytes], log: Path, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"hps serve not ready ({proc.poll()}):\n{log.read_text(errors='replace')}")
        time.sleep(0.2)


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_removed_segment_files_while_updates_flow_leave_no_stale_answer(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    model = f"shm{uuid.uuid4().hex[:8]}"
    shm = f"hps_rm_{uuid.uuid4().hex[:12]}"
    rng = np.random.default_rng(27)
    keys = rng.choice(1 << 40, size=ROWS, replace=False).astype(np.int64)
    write_sparse_model(tmp_path / "tables" / "u", keys, _rows(0, np.arange(ROWS)))
    ps = tmp_path / "ps.json"
    ps.write_text(json.dumps(_doc(tmp_path, model, shm, kafka_broker.bootstrap)))
    path = f"/dev/shm/{shm}"
    hot, cold = keys[:HOT], keys[HOT : 2 * HOT]
    http, metrics, consume_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "wb") as out:
        serve = subprocess.Popen(
            [*HPS, "serve", "--config", str(ps), "--http-port", str(http), "--grpc-port",
             str(free_port()), "--metrics-port", str(metrics), "--metrics-interval", "0",
             "--state-dir", str(tmp_path / "state")],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    consume_log = tmp_path / "consume.log"
    consume = None
    rounds: Rounds | None = None
    try:
        _wait_line(serve, serve_log, "ready: serving", 180)
        url, metrics_url = f"127.0.0.1:{http}", f"http://127.0.0.1:{metrics}/metrics"
        with open(consume_log, "wb") as out:
            consume = subprocess.Popen(
                [*HPS, "consume", "--config", str(ps), "--metrics-port", str(consume_port)],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        wait_for(lambda: _healthz(consume_port) == 200, 120, f"hps consume ({consume_log})")
        rounds = Rounds(kafka_broker.bootstrap, model, consume_port, hot).start()
        wait_for(lambda: rounds.confirmed >= 3 or rounds.errors, 120, "three rounds applied")
        assert not rounds.errors, rounds.errors
        for ref, got in _batch(url, model, rounds, hot):  # before: served as they flow
            assert (got[:, 0] >= ref).all()
        users = _header(path, HeaderWord.ATTACHED)  # hps consume and both instances
        assert users >= 3, users
        old = path_identity(path)

        # -- the fault: the segment's files removed while rounds flow ----------------------
        removed_at = rounds.confirmed
        removed_t = time.monotonic()  # reported below, not asserted (a shared machine)
        for suffix in ("", ".lock", ".users", ".turn"):
            os.unlink(path + suffix)

        def one_segment() -> bool:
            now = path_identity(path)
            return (
                now is not None
                and now != old
                and _header(path, HeaderWord.ATTACHED) == users
                and _header(path, HeaderWord.FILLED) >= 1
            )

        wait_for(one_segment, 120, "every process on one new, refilled segment")
        before = _requests_per_process(metrics_url, model)

        def fresh_from_both() -> bool:
            answers = _batch(url, model, rounds, hot)
            grew = [p for p, v in _requests_per_process(metrics_url, model).items()
                    if v > before.get(p, 0)]  # fmt: skip
            return len(grew) >= 2 and all((got[:, 0] >= ref).all() for ref, got in answers)

        wait_for(fresh_from_both, 120, "both instances to answer the confirmed round")
        recovered_at = rounds.confirmed
        recovered_s = time.monotonic() - removed_t

        # -- the checking window: 0 stale answers --------------------------------------------
        start = _requests_per_process(metrics_url, model)
        checked = stale = wrong = 0
        while rounds.confirmed < recovered_at + WINDOW_ROUNDS:
            assert not rounds.errors, rounds.errors
            for ref, got in _batch(url, model, rounds, hot):
                checked += 1
                stale += int((got[:, 0] < ref).any())
                wrong += int((got[:, 1] != np.arange(HOT) + 0.5).any())
        end = _requests_per_process(metrics_url, model)
        served = {p: end[p] - start.get(p, 0) for p in end if end[p] > start.get(p, 0)}
        assert stale == 0 and wrong == 0, f"{stale} stale, {wrong} wrong of {checked} answers"
        assert len(served) >= 2, f"one instance answered nothing in the window: {served}"
        for _, got in _batch(url, model, rounds, cold):  # never updated: from the refill
            np.testing.assert_array_equal(got, _rows(0, np.arange(HOT, 2 * HOT)))
        assert _healthz(consume_port) == 200
        print(
            f"\nsegment removed at round {removed_at}; one refilled segment and fresh answers "
            f"from both instances by round {recovered_at}, {recovered_s:.1f} s after the "
            f"removal; then {checked} answers over "
            f"{WINDOW_ROUNDS} rounds: {stale} stale (per instance: {served})"
        )

        # -- removed while hps consume is down: the instances say so until it refills -------
        rounds.stop()
        last = rounds.confirmed  # the last round published: what L3 holds now
        rounds = None
        consume.send_signal(signal.SIGTERM)
        assert consume.wait(60) == 0
        journal = Journal(journal_dir(tmp_path / "rocksdb"))

        def problems() -> list[str | None]:
            return [c.problem for c in journal.cursors() if c.model == model and c.age_s < 5]

        old = path_identity(path)
        for suffix in ("", ".lock", ".users", ".turn"):
            os.unlink(path + suffix)
        wait_for(
            lambda: (p := problems()) and len(p) == 2 and all(x and "hps consume" in x for x in p),
            60,
            "both instances to report the removed segment in their heartbeats",
        )
        assert path_identity(path) not in (None, old)  # they moved to a new, empty one
        with open(consume_log, "ab") as out:
            consume = subprocess.Popen(
                [*HPS, "consume", "--config", str(ps), "--metrics-port", str(consume_port)],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        wait_for(lambda: problems() == [None, None], 120, "the instances ready again")
        assert _header(path, HeaderWord.FILLED) >= 1  # the restarted consumer filled it
        assert _header(path, HeaderWord.ATTACHED) == users
        for _, got in _batch(url, model, None, hot):
            np.testing.assert_array_equal(got, _rows(last, np.arange(HOT)))
    finally:
        if rounds is not None:
            rounds.stop()
        if consume is not None:
            consume.send_signal(signal.SIGTERM)
            try:
                consume.wait(30)
            except subprocess.TimeoutExpired:
                consume.kill()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        for suffix in ("", ".lock", ".users", ".turn"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)

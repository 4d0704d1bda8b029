"""The consumer loop's heartbeat: alive while the loop goes round, failing once it stalls.

The loop runs over an in-memory source; a stall is an L2 insert that blocks until the test
lets it go. What reads the pulse is what Kubernetes and Compose read: ``/healthz`` on the
metrics port, the heartbeat file through ``hps consume-check``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.cli import main
from hps.net import free_port
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.updates import consumer as consumer_module
from hps.updates.applier import Applier
from hps.updates.consumer import UpdateConsumer
from hps.updates.heartbeat import Heartbeat, check_file, serve_metrics
from tests.unit.updates.test_update_consumer_loop import (
    SPEC,
    FakeSource,
    FlakyStore,
    settings,
    upsert,
)

MAX_AGE_S = 0.5
WAIT_S = 10.0  # a safety net for the waits below, far above what they take


class BlockingStore(HashMapStore):
    """An L2 whose inserts hang while ``gate`` is clear: the loop stalls inside an apply."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def insert(self, table: str, keys: Any, values: Any) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never released the stalled insert"
        super().insert(table, keys, values)


class EndlessSource(FakeSource):
    """A topic that keeps receiving updates, one message per poll."""

    def __init__(self) -> None:
        super().__init__([])
        self.sent = 0

    def poll(self, timeout_s: float) -> Any:
        time.sleep(0.01)
        self.sent += 1
        return upsert([self.sent % 7], self.sent, self.sent)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A running consumer loop with a heartbeat file and a metrics port; stopped at the end."""
    l2 = BlockingStore()
    heartbeat = Heartbeat(tmp_path / "heartbeat", file_interval_s=0.0)
    applier = Applier({SPEC.name: SPEC}, Tiers(l2, HashMapStore()))
    consumer = UpdateConsumer(
        EndlessSource(),  # type: ignore[arg-type]
        applier,
        settings(max_batch_size=1),
        heartbeat=heartbeat,
    )
    port = free_port()
    server = serve_metrics(port, "127.0.0.1", heartbeat, MAX_AGE_S)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield {"l2": l2, "heartbeat": heartbeat, "port": port, "consumer": consumer}
    finally:
        stop.set()
        l2.gate.set()
        thread.join(WAIT_S)
        heartbeat.close()
        server.shutdown()
        server.server_close()


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def consume_check(path: Path, max_age_s: float = MAX_AGE_S) -> int:
    return main(["consume-check", "--heartbeat-file", str(path), "--max-age-s", str(max_age_s)])


def test_a_running_loop_passes(loop: dict[str, Any]) -> None:
    consumer, heartbeat = loop["consumer"], loop["heartbeat"]
    wait_for(lambda: consumer.batches >= 3, "three batches")
    time.sleep(2 * MAX_AGE_S)  # longer than the limit: only a loop still going round passes
    assert consumer.batches > 3
    assert heartbeat.check(MAX_AGE_S) is None
    status, body = healthz(loop["port"])
    assert status == 200 and body.startswith("ok"), body
    assert consume_check(heartbeat.path) == 0


def test_a_stalled_loop_fails_and_recovers(
    loop: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    l2, heartbeat, port = loop["l2"], loop["heartbeat"], loop["port"]
    wait_for(lambda: heartbeat.check(MAX_AGE_S) is None, "the first pass")
    l2.entered.clear()
    l2.gate.clear()  # the next insert hangs: the loop stalls inside an apply
    assert l2.entered.wait(WAIT_S)
    time.sleep(MAX_AGE_S + 0.3)
    problem = heartbeat.check(MAX_AGE_S)
    assert problem is not None and "stalled" in problem
    status, body = healthz(port)  # the port still answers; the answer says the loop is stuck
    assert status == 503 and "stalled" in body, body
    assert consume_check(heartbeat.path) == 1
    assert "stalled" in capsys.readouterr().err
    l2.gate.set()  # the insert returns, the loop goes round again
    wait_for(lambda: heartbeat.check(MAX_AGE_S) is None, "the loop to recover")
    assert healthz(port)[0] == 200
    assert consume_check(heartbeat.path) == 0


def test_waiting_out_a_failing_tier_is_not_a_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refusing for longer than the limit: the retries keep the heartbeat going."""
    monkeypatch.setattr(consumer_module, "MAX_BACKOFF_S", 0.05)  # 5 s in production
    heartbeat = Heartbeat(tmp_path / "heartbeat", file_interval_s=0.0)
    l2 = FlakyStore(failures=30)
    applier = Applier({SPEC.name: SPEC}, Tiers(l2, HashMapStore()))
    source = FakeSource([upsert([1], 1, 0)])
    consumer = UpdateConsumer(
        source,  # type: ignore[arg-type]
        applier,
        settings(failure_backoff_ms=20),
        heartbeat=heartbeat,
    )
    ages: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            ages.append(heartbeat.age_s())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    assert consumer.run_once(threading.Event()) == 1
    stop.set()
    watcher.join()
    assert time.monotonic() - start > 2 * MAX_AGE_S  # the outage outlasted the limit
    ages = [a for a in ages if a != float("inf")]  # the watcher may look before the first pass
    assert ages and max(ages) < MAX_AGE_S and source.stored == [0]
    assert l2.fetch(SPEC.name, np.array([1]))[1].all()


def test_before_the_first_pass_and_after_a_clean_stop(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat"
    heartbeat = Heartbeat(path)
    assert heartbeat.check(MAX_AGE_S) == "the consumer loop has not started a pass yet"
    assert consume_check(path) == 1
    heartbeat.beat()
    # a limit no busy machine reaches between the beat and the check: this is about the file
    assert path.exists() and consume_check(path, max_age_s=60.0) == 0
    heartbeat.close()  # a clean stop removes the file: the check fails at once
    assert not path.exists() and consume_check(path, max_age_s=60.0) == 1
    heartbeat.close()  # twice is harmless


def test_the_file_is_touched_at_most_once_a_second(tmp_path: Path) -> None:
    now = [100.0]
    heartbeat = Heartbeat(tmp_path / "hb", clock=lambda: now[0])
    heartbeat.beat()
    first = (tmp_path / "hb").stat().st_mtime_ns
    assert check_file(tmp_path / "hb", 5.0, now=time.time() + 10) is not None
    assert check_file(tmp_path / "hb", 5.0) is None
    now[0] += 0.5
    heartbeat.beat()
    assert (tmp_path / "hb").stat().st_mtime_ns == first and heartbeat.age_s() == 0.0
    now[0] += 0.6
    time.sleep(0.01)
    heartbeat.beat()
    assert (tmp_path / "hb").stat().st_mtime_ns > first


def test_metrics_are_still_served(loop: dict[str, Any]) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{loop['port']}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "hps_update" in text or "python_info" in text
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{loop['port']}/nothing", timeout=5)
    assert err.value.code == 404


def test_consume_refuses_a_limit_an_idle_poll_would_break(tmp_path: Path) -> None:
    config = tmp_path / "ps.json"
    us = {"type": "kafka", "poll_timeout_ms": 2000}
    config.write_text(json.dumps({"models": [{"model": "m"}], "update_source": us}))
    for limit in ("3", "8"):  # under 2 polls; under 2 of the longest retry back-offs (5 s)
        code = main(["consume", "--config", str(config), "--max-loop-age-s", limit])
        assert code == 2  # a ConfigError, before anything connects

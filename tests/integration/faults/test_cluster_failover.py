"""A Redis Cluster master SIGKILLed, its replica promoted, while updates and lookups flow.

Cluster: 3 masters + 3 replicas (``cluster-node-timeout`` 2 s). A LookupSession (Redis
Cluster L2 + RocksDB L3) answers lookups in a thread the whole time and an in-process
``hps consume`` loop applies a stream of updates. One master is SIGKILLed; its replica takes
over. Requests keep succeeding (L3 answers while L2 fails); no update is lost: L3 ends
exact, and L2 holds no row that differs from the final state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.testing.kafka import TansuBroker
from hps.testing.redis import HOST, SLOTS, RedisNode
from hps.updates import Publisher
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_config, wait_for

pytestmark = pytest.mark.integration

MASTERS = 3
KEYS = 3000


def _info(node: RedisNode) -> str:
    with contextlib.closing(node.client(socket_connect_timeout=1)) as c:
        out = c.execute_command("CLUSTER", "INFO")
    return out.decode() if isinstance(out, bytes) else str(out)


def _role(node: RedisNode) -> str:
    with contextlib.closing(node.client(socket_connect_timeout=1)) as c:
        return str(c.info("replication")["role"])


def _synced(node: RedisNode) -> bool:
    with contextlib.closing(node.client(socket_connect_timeout=1)) as c:
        return c.info("replication").get("master_link_status") == "up"


def _ok(nodes: list[RedisNode]) -> bool:
    try:
        return all("cluster_state:ok" in _info(n) for n in nodes)
    except Exception:
        return False


@pytest.fixture
def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    fast = ["--repl-diskless-sync-delay", "0"]
    masters = [RedisNode(tmp_path / f"m{i}", cluster=True, extra_args=fast) for i in range(MASTERS)]
    replicas = [RedisNode(tmp_path / f"r{i}", cluster=True) for i in range(MASTERS)]
    nodes = masters + replicas
    try:
        for n in nodes:
            n.start()
        for i, m in enumerate(masters):
            lo, hi = i * SLOTS // MASTERS, (i + 1) * SLOTS // MASTERS - 1
            with contextlib.closing(m.client()) as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        with contextlib.closing(masters[0].client()) as c:
            for n in nodes[1:]:
                c.execute_command("CLUSTER", "MEET", HOST, n.port)
        wait_for(lambda: _ok(masters), 30, "cluster_state:ok")
        for m, r in zip(masters, replicas, strict=True):
            with contextlib.closing(m.client()) as c:
                master_id = c.execute_command("CLUSTER", "MYID")
            master_id = master_id.decode() if isinstance(master_id, bytes) else master_id

            def replicate(r: RedisNode = r, mid: str = master_id) -> bool:
                try:
                    with contextlib.closing(r.client()) as c:
                        c.execute_command("CLUSTER", "REPLICATE", mid)
                    return True
                except Exception:  # the replica has not learnt of the master yet
                    return False

            wait_for(replicate, 30, f"{r.address} to replicate {m.address}")
        wait_for(lambda: _ok(nodes), 30, "cluster_state:ok with replicas")
        wait_for(lambda: all(_synced(r) for r in replicas), 30, "the replicas' first sync")
        yield masters, replicas
    finally:
        for n in nodes:
            if n.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGCONT)
            n.stop()


def test_master_killed_replica_promoted_requests_succeed_no_update_lost(
    tmp_path: Path, kafka_broker: TansuBroker, cluster
) -> None:
    masters, replicas = cluster
    cfg = update_config(
        tmp_path,
        kafka_broker.bootstrap,
        volatile={
            "type": "redis_cluster",
            "address": ",".join(n.address for n in masters),
            "num_partitions": 12,
            "hps_socket_timeout_s": 1.0,
        },
        failure_backoff_ms=50,
    )
    model = cfg.models[0].model
    table = f"{model}.t0"
    keys = np.arange(KEYS, dtype=np.int64)
    base = np.repeat(keys[:, None].astype(np.float32), 4, 1)
    session = build_session(cfg, with_cache=False)
    session.insert(table, keys, base)  # L3 and L2 hold every row before the fault
    want = {k: base[k] for k in range(KEYS)}
    stop, errors, served, wrong = threading.Event(), [], [0], [0]
    steady = keys[keys % 2 == 0]  # never updated: their vectors are known at all times

    def lookups() -> None:
        rng = np.random.default_rng(1)
        while not stop.is_set():
            k = rng.choice(steady, 64)
            try:
                out = session.lookup(table, k)
            except Exception as exc:
                errors.append(repr(exc))
                continue
            served[0] += 1
            wrong[0] += int(not np.array_equal(out, base[k]))

    reader = threading.Thread(target=lookups)
    reader.start()
    try:
        with running(build_service(cfg, session)), Publisher(kafka_broker.bootstrap) as pub:
            odd = keys[keys % 2 == 1]

            def publish(i: int) -> None:
                k = np.random.default_rng(i).choice(odd, 100, replace=False)
                v = np.repeat((k * 10 + i)[:, None].astype(np.float32), 4, 1)
                pub.publish(model, "t0", k, v, version=1000 + i)
                want.update(zip(k.tolist(), v, strict=True))

            for i in range(10):
                publish(i)
            pub.flush()
            wait_for(lambda: l3_holds(session, table, want), 60, "the first updates applied")
            before_kill = served[0]
            victim = masters[0]
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            for i in range(10, 40):  # updates keep coming during the failover
                publish(i)
                pub.flush()
                time.sleep(0.1)
            wait_for(lambda: _role(replicas[0]) == "master", 30, "the replica's promotion")
            promoted_after = time.monotonic() - killed_at
            wait_for(lambda: l3_holds(session, table, want), 60, "every update applied")
            during = served[0] - before_kill
    finally:
        stop.set()
        reader.join(30)
    try:
        assert not errors, errors[:3]
        assert wrong[0] == 0
        assert during > 0
        all_keys = np.array(sorted(want), dtype=np.int64)
        rows = np.stack([want[k] for k in all_keys.tolist()])
        assert session.tiers.persistent is not None and session.tiers.volatile is not None
        v3, f3 = session.tiers.persistent.fetch(table, all_keys)
        assert f3.all()
        np.testing.assert_array_equal(v3, rows)
        wait_for(lambda: _l2_answers(session, table), 30, "L2 to answer again")
        v2, f2 = session.tiers.volatile.fetch(table, all_keys)
        stale = int((~np.all(v2[f2] == rows[f2], axis=1)).sum())
        print(
            f"\nmaster SIGKILLed; replica promoted after {promoted_after:.1f}s; "
            f"{served[0]} lookups, {during} after the kill, 0 errors, 0 wrong; "
            f"L3 exact; L2 holds {int(f2.sum())}/{all_keys.size} rows, {stale} stale"
        )
        assert stale == 0
    finally:
        session.close()


def _l2_answers(session, table: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        session.tiers.volatile.fetch(table, np.arange(10, dtype=np.int64))
        return True
    except Exception:
        return False


def l3_holds(session, table: str, want: dict) -> bool:  # type: ignore[no-untyped-def,type-arg]
    keys = np.array(sorted(want), dtype=np.int64)
    values, found = session.tiers.persistent.fetch(table, keys)
    return bool(found.all() and np.array_equal(values, np.stack([want[k] for k in keys.tolist()])))

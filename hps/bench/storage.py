"""L2/L3 storage: fetch and insert throughput of one backend against its raw driver baseline.

``--rows`` rows of ``--dim`` floats are loaded through the backend, then ``--repeats`` random
batches of ``--batch`` keys are fetched, and as many inserted (overwrites), alternating with
the baseline on the same batch. Baselines, their inputs prepared before the clock starts:

- ``hash_map``: a NumPy gather ``values[idx]`` / scatter ``values[idx] = batch`` with row
  indices known in advance (no hashing at all);
- ``redis`` / ``redis_cluster``: redis-py pipelined HMGET / HSET of the same bytes in the
  same partition hashes (the store's own data), replies left undecoded;
- ``rocksdb``: a raw rocksdict ``Rdict.get(list_of_keys)`` / ``WriteBatch`` (put in stored
  key order, as the store puts it) on a second database holding the same rows.

``load_keys_per_s`` is the rate of that load (into an empty store); for ``hash_map``,
``load_peak_bytes_per_row`` is the most the load had allocated at once (``tracemalloc``), per
row, beside ``bytes_per_row``, what the loaded table holds.

``rocksdb`` also times a secondary's catch-up (``op: catch_up``) after each of ``--repeats``
writes of ``--batch`` rows, with ``--tables`` column families (a model of that many tables):
our secondary (``mode="secondary"``) against a rocksdict secondary with rocksdict's default
options, both following the store's database.

``ratio`` is baseline time / our time over all batches (1.0: we add nothing to the driver);
``ratio_median`` is the median of the per-batch ratios, steadier on a shared machine.

Without ``--address`` a throwaway redis-server (or 3-master cluster) is started and stopped;
with it, the table ``bench.t`` (its rows and its format record) is removed from that server
at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hps.cli import positive_int
from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.storage import open_store
from hps.storage.base import EmbeddingStore
from hps.types import JSON, TableSpec

BACKENDS = ("hash_map", "redis", "redis_cluster", "rocksdb")
RawCalls = tuple[Callable[[], object], Callable[[], object]]  # fetch, insert: bound

if TYPE_CHECKING:
    from hps.storage.redis_cluster import RedisStore


@dataclass
class Harness:
    """A loaded store plus the raw baseline for one backend."""

    store: EmbeddingStore
    spec: TableSpec
    baseline: str
    prepare: Callable[[np.ndarray, np.ndarray, np.ndarray], RawCalls]  # idx, keys, values
    extra: JSON = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="hash_map")
    parser.add_argument("--rows", type=positive_int, default=1_000_000)
    parser.add_argument("--dim", type=positive_int, default=64)
    parser.add_argument(
        "--batch", type=positive_int, default=65_536, help="keys per fetch / insert"
    )
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed batches per op")
    parser.add_argument("--address", help="Redis host:port (any node of a cluster)")
    parser.add_argument("--path", help="RocksDB folder (a temporary one otherwise)")
    parser.add_argument("--partitions", type=positive_int, default=16, help="Redis num_partitions")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--tables", type=positive_int, default=26, help="rocksdb: column families for the catch-up"
    )


def run(args: argparse.Namespace) -> Iterator[JSON]:
    rng = np.random.default_rng(args.seed)
    keys = rng.permutation(args.rows).astype(np.int64) * 7919 + 1
    values = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    spec = TableSpec(model="bench", table="t", dim=args.dim)
    with contextlib.ExitStack() as stack:
        h = _harness(args, spec, keys, values, stack)
        common = {
            "bench": "storage",
            "backend": args.backend,
            "rows": args.rows,
            "dim": args.dim,
            "batch": args.batch,
            "repeats": args.repeats,
            "baseline": h.baseline,
            **h.extra,
        }
        for op in ("fetch", "insert"):
            ours_s, base_s = _time_op(op, h, keys, values, args, rng)
            ours, base = sum(ours_s), sum(base_s)
            n = args.repeats * args.batch
            yield {
                **common,
                "op": op,
                "keys_per_s": round(n / ours),
                "baseline_keys_per_s": round(n / base),
                "ratio": round(base / ours, 3),
                # per-batch ratios: less sensitive to bursts of load from other processes
                "ratio_median": round(float(np.median(np.array(base_s) / np.array(ours_s))), 3),
            }
        if args.backend == "rocksdb":
            ours_s, base_s = _time_catch_up(h, args, rng)
            yield {
                **common,
                "op": "catch_up",
                "tables": args.tables,
                "catch_up_ms": round(1000 * float(np.median(ours_s)), 2),
                "baseline_catch_up_ms": round(1000 * float(np.median(base_s)), 2),
                "ratio": round(sum(base_s) / sum(ours_s), 3),
            }


def _time_op(
    op: str, h: Harness, keys: np.ndarray, values: np.ndarray, args: argparse.Namespace,
    rng: np.random.Generator,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """Seconds per timed batch: ours, baseline."""
    ours: list[float] = []
    base: list[float] = []
    for r in range(args.repeats + 1):  # round 0 warms up and is not counted
        idx = rng.integers(0, keys.size, args.batch)
        k = keys[idx]
        v = values[idx] + np.float32(r + 1)
        raw_fetch, raw_insert = h.prepare(idx, k, v)
        calls: tuple[tuple[Callable[..., object], tuple[object, ...]], ...] = (
            ((h.store.fetch, (h.spec.name, k)), (raw_fetch, ()))
            if op == "fetch"
            else ((h.store.insert, (h.spec.name, k, v)), (raw_insert, ()))
        )
        spent = [0.0, 0.0]
        for slot in (0, 1) if r % 2 else (1, 0):
            fn, fargs = calls[slot]
            t0 = time.perf_counter()
            fn(*fargs)
            spent[slot] = time.perf_counter() - t0
        if r:
            ours.append(spent[0])
            base.append(spent[1])
    return ours, base


def _time_catch_up(
    h: Harness, args: argparse.Namespace, rng: np.random.Generator
) -> tuple[list[float], list[float]]:
    """Seconds per catch-up after a write of ``--batch`` rows: ours, baseline."""
    import rocksdict as rd

    from hps.storage.rocks_db import RocksDBStore

    assert isinstance(h.store, RocksDBStore)
    specs = [h.spec] + [TableSpec("bench", f"t{i}", h.spec.dim) for i in range(1, args.tables)]
    for spec in specs[1:]:
        h.store.open_table(spec)
    h.store.insert(h.spec.name, np.array([0], np.int64), np.zeros((1, h.spec.dim), np.float32))
    ours = RocksDBStore(h.store.path, mode="secondary")
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        stack.callback(ours.close)
        for spec in specs:
            ours.open_table(spec)
        names = rd.Rdict.list_cf(h.store.path)
        raw = rd.Rdict(
            h.store.path,
            rd.Options(raw_mode=True),
            column_families={n: rd.Options(raw_mode=True) for n in names},
            access_type=rd.AccessType.secondary(tmp),
        )
        stack.callback(raw.close)
        times: tuple[list[float], list[float]] = ([], [])
        calls = (ours.catch_up, raw.try_catch_up_with_primary)
        for r in range(args.repeats + 1):  # round 0 warms up and is not counted
            spec = specs[r % len(specs)]
            keys = rng.integers(0, 1 << 40, args.batch)
            rows = rng.standard_normal((args.batch, spec.dim), dtype=np.float32)
            h.store.insert(spec.name, keys, rows)
            for slot in (0, 1) if r % 2 else (1, 0):
                t0 = time.perf_counter()
                calls[slot]()
                if r:
                    times[slot].append(time.perf_counter() - t0)
        return times


def _harness(
    args: argparse.Namespace, spec: TableSpec, keys: np.ndarray, values: np.ndarray,
    stack: contextlib.ExitStack,
) -> Harness:  # fmt: skip
    if args.backend == "hash_map":
        return _hash_map(args, spec, keys, values, stack)
    if args.backend == "rocksdb":
        return _rocksdb(args, spec, keys, values, stack)
    return _redis(args, spec, keys, values, stack)


def _load(store: EmbeddingStore, spec: TableSpec, keys: np.ndarray, values: np.ndarray,
          batch: int) -> JSON:  # fmt: skip
    """Load every row through the store; its load rate goes into the report."""
    store.open_table(spec)
    start = time.perf_counter()
    for lo in range(0, keys.size, batch):
        store.insert(spec.name, keys[lo : lo + batch], values[lo : lo + batch])
    return {"load_keys_per_s": round(keys.size / (time.perf_counter() - start))}


def _hash_map(args: argparse.Namespace, spec: TableSpec, keys: np.ndarray, values: np.ndarray,
              stack: contextlib.ExitStack) -> Harness:  # fmt: skip
    from hps.storage.hash_map import HashMapStore

    store = open_store(VolatileDBConfig(type="hash_map", max_batch_size=args.batch))
    assert isinstance(store, HashMapStore)
    stack.callback(store.close)
    tracemalloc.start()  # NumPy reports its buffers to it: the load's peak allocation
    try:
        loaded = _load(store, spec, keys, values, args.batch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    raw = values.copy()

    def prepare(idx: np.ndarray, k: np.ndarray, v: np.ndarray) -> RawCalls:
        def put() -> None:
            raw[idx] = v

        return (lambda: raw[idx]), put

    nbytes = store.nbytes(spec.name)
    return Harness(
        store, spec, "numpy gather/scatter with precomputed row indices", prepare,
        extra={**loaded, "bytes_per_row": round(nbytes / keys.size, 1),
               "load_peak_bytes_per_row": round(peak / keys.size, 1),
               "raw_bytes_per_row": 8 + 4 * spec.dim},
    )  # fmt: skip


def _rocksdb(args: argparse.Namespace, spec: TableSpec, keys: np.ndarray, values: np.ndarray,
             stack: contextlib.ExitStack) -> Harness:  # fmt: skip
    import rocksdict as rd

    from hps.dedup import stored_order
    from hps.storage.keybytes import key_bytes

    tmp = args.path or stack.enter_context(tempfile.TemporaryDirectory(prefix="hps-bench-"))
    root = Path(tmp)
    store = open_store(PersistentDBConfig(type="rocks_db", path=str(root / "hps"),
                                          max_batch_size=args.batch))  # fmt: skip
    assert store is not None
    stack.callback(store.close)
    loaded = _load(store, spec, keys, values, args.batch)
    opts = rd.Options(raw_mode=True)
    opts.create_if_missing(True)
    db = rd.Rdict(str(root / "raw"), opts)
    stack.callback(db.close)
    row = f"V{4 * spec.dim}"

    def put(kbs: list[bytes], vbs: list[bytes]) -> None:
        wb = rd.WriteBatch(raw_mode=True)
        for kb, vb in zip(kbs, vbs, strict=True):
            wb.put(kb, vb)
        db.write(wb)

    def prepare(idx: np.ndarray, k: np.ndarray, v: np.ndarray) -> RawCalls:
        wanted: list[str | int | float | bytes | bool] = [*key_bytes(k)]  # Rdict.get's type
        order = stored_order(k)
        kbs, vbs = key_bytes(k[order]), v[order].view(row).ravel().tolist()
        return (lambda: db.get(wanted)), (lambda: put(kbs, vbs))

    for lo in range(0, keys.size, args.batch):
        put(key_bytes(keys[lo : lo + args.batch]),
            values[lo : lo + args.batch].view(row).ravel().tolist())  # fmt: skip
    return Harness(
        store, spec, "rocksdict Rdict.get(list of key bytes) / WriteBatch in stored key order, "
        "second database",
        prepare,
        extra=loaded,
    )  # fmt: skip


def _redis(args: argparse.Namespace, spec: TableSpec, keys: np.ndarray, values: np.ndarray,
           stack: contextlib.ExitStack) -> Harness:  # fmt: skip
    from hps.storage.keybytes import key_bytes
    from hps.storage.redis_cluster import RedisStore
    from hps.storage.redis_layout import group_by_partition, hash_name
    from hps.testing.redis import throwaway_redis

    address = args.address
    if not address:
        server = stack.enter_context(throwaway_redis(cluster=args.backend == "redis_cluster"))
        address = ",".join(server.addresses)
    cfg = VolatileDBConfig(type=args.backend, address=address, num_partitions=args.partitions,
                           max_batch_size=args.batch)  # fmt: skip
    store = open_store(cfg)
    assert isinstance(store, RedisStore)
    stack.callback(store.close)
    # Opened here, before the clean-up is registered: a table whose record says another
    # format is refused with that cause, and is not dropped.
    store.open_table(spec)
    if args.address:  # a server we did not start keeps running: take the table back out
        stack.callback(store.drop_table, spec.name)
    client = store.client  # the baseline uses the same connections
    before = _used_memory(store)
    loaded = _load(store, spec, keys, values, args.batch)
    used = _used_memory(store) - before
    hashes = [hash_name(spec.name, p) for p in range(args.partitions)]
    row = f"V{4 * spec.dim}"

    def prepare(idx: np.ndarray, k: np.ndarray, v: np.ndarray) -> RawCalls:
        order, groups = group_by_partition(k, args.partitions)
        fields = key_bytes(k[order])
        rows = v[order].view(row).ravel().tolist()
        gets: list[tuple[bytes, list[bytes]]] = []
        sets: list[tuple[bytes, list[bytes]]] = []
        for p, lo, hi in groups:
            gets.append((hashes[p], fields[lo:hi]))
            pairs = [b""] * (2 * (hi - lo))
            pairs[0::2], pairs[1::2] = fields[lo:hi], rows[lo:hi]
            sets.append((hashes[p], pairs))
        return (lambda: pipelined("HMGET", gets)), (lambda: pipelined("HSET", sets))

    def pipelined(command: str, calls: list[tuple[bytes, list[bytes]]]) -> object:
        pipe = client.pipeline(transaction=False)
        for name, rest in calls:
            pipe.execute_command(command, name, *rest)
        return pipe.execute()

    return Harness(
        store, spec, "redis-py pipelined HMGET/HSET, same hashes, replies not decoded",
        prepare,
        extra={**loaded, "cluster": store.cluster, "partitions": args.partitions,
               "redis_bytes_per_row": round(used / keys.size, 1),
               "raw_bytes_per_row": 8 + 4 * spec.dim},
    )  # fmt: skip


def _used_memory(store: RedisStore) -> int:
    """Sum of ``used_memory`` over the Redis node(s) the store talks to."""
    from redis.cluster import RedisCluster

    client = store.client
    if isinstance(client, RedisCluster):
        nodes = [n.redis_connection for n in client.get_primaries()]
        return sum(int(c.info("memory")["used_memory"]) for c in nodes)
    return int(client.info("memory")["used_memory"])

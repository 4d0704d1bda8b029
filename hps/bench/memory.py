"""Memory per row of each tier and row format, measured from real usage, and what it costs.

For every tier, dimension (``--dims``) and row format, ``--rows`` random rows are written
through our code into a fresh store and its usage is read back, never computed:

- ``l1``: the bytes an :class:`hps.cache.EmbeddingCache` of ``--rows`` capacity allocated;
- ``hash_map``: the bytes of the in-process L2's arrays (index, arena, bookkeeping);
- ``multi_process_hash_map``: the bytes of shared memory the table's extents hold;
- ``rocks_db``: the size of the column family's SST files after a full compaction;
- ``redis``: the growth of a throwaway redis-server's ``used_memory``.

Each row of output is one (tier, dim, format): ``bytes_per_row``, ``rows_per_gb`` and
``ratio``: its rows per GB against float32's in the same tier and dim (the baseline). Then,
per format, how far the example CTR model's scores move when its embedding tables are stored
in that format instead of float32 (``ctr_scores``: mean and max absolute difference of the
click probabilities over ``--samples`` random requests).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from hps.cli import positive_int
from hps.rowformat import FORMATS, ROW_DTYPES
from hps.types import JSON, TableSpec

TIERS = ("l1", "hash_map", "multi_process_hash_map", "rocks_db", "redis")
CHUNK = 65_536
Measure = Callable[[TableSpec, np.ndarray, np.ndarray], int]  # spec, keys, stored rows -> bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiers", nargs="+", choices=TIERS, default=list(TIERS))
    parser.add_argument("--dims", nargs="+", type=positive_int, default=[16, 64, 128])
    parser.add_argument("--rows", type=positive_int, default=200_000, help="rows per store")
    parser.add_argument("--samples", type=positive_int, default=4096, help="CTR requests scored")
    parser.add_argument("--seed", type=int, default=7)


def run(args: argparse.Namespace) -> Iterator[JSON]:
    rng = np.random.default_rng(args.seed)
    keys = rng.permutation(np.arange(args.rows, dtype=np.int64) * 7919 + 1)
    for tier in args.tiers:
        with _measurer(tier) as measure:
            for dim in args.dims:
                values = rng.standard_normal((args.rows, dim), dtype=np.float32)
                base = None
                for name in ROW_DTYPES:
                    spec = TableSpec(model="bench", table=f"t{dim}_{name}", dim=dim, row_dtype=name)
                    used = measure(spec, keys, spec.fmt.encode(values))
                    per_row = used / args.rows
                    base = base or per_row
                    yield {
                        "bench": "memory",
                        "tier": tier,
                        "dim": dim,
                        "row_dtype": name,
                        "rows": args.rows,
                        "bytes_per_row": round(per_row, 1),
                        "stored_row_bytes": spec.fmt.row_bytes(dim),
                        "rows_per_gb": round(1e9 / per_row),
                        "baseline": "float32, same tier and dim",
                        "ratio": round(base / per_row, 3),
                    }
    yield from _ctr_scores(args.samples, args.seed)


@contextlib.contextmanager
def _measurer(tier: str) -> Iterator[Measure]:
    if tier == "redis":
        from hps.testing.redis import throwaway_redis

        with throwaway_redis(cluster=False) as server:
            yield _redis(server.address)
        return
    with tempfile.TemporaryDirectory(prefix="hps-bench-memory-") as tmp:
        yield {
            "l1": _l1,
            "hash_map": _hash_map,
            "multi_process_hash_map": _shm,
            "rocks_db": lambda spec, keys, rows: _rocks_db(Path(tmp), spec, keys, rows),
        }[tier]


def _chunks(keys: np.ndarray, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for lo in range(0, keys.size, CHUNK):
        yield keys[lo : lo + CHUNK], rows[lo : lo + CHUNK]


def _l1(spec: TableSpec, keys: np.ndarray, rows: np.ndarray) -> int:
    from hps.cache import EmbeddingCache

    cache = EmbeddingCache(spec.dim, keys.size, fmt=spec.fmt, static_fraction=0.0)
    for k, r in _chunks(keys, rows):
        cache.insert(k, r, force=True)
    if len(cache) != keys.size:
        raise RuntimeError(f"L1 holds {len(cache)} of {keys.size} rows")
    return cache.nbytes


def _hash_map(spec: TableSpec, keys: np.ndarray, rows: np.ndarray) -> int:
    from hps.storage.hash_map import HashMapStore

    store = HashMapStore()
    store.open_table(spec)
    for k, r in _chunks(keys, rows):
        store.insert(spec.name, k, r)
    return store.nbytes(spec.name)


def _shm(spec: TableSpec, keys: np.ndarray, rows: np.ndarray) -> int:
    from hps.storage.multi_process_hash_map import SharedHashMapStore

    size = int(2 * keys.size * (spec.fmt.row_bytes(spec.dim) + 64)) + (64 << 20)
    store = SharedHashMapStore(f"hps_bench_{uuid.uuid4().hex[:8]}", size, max_batch_size=CHUNK)
    try:  # the segment is removed when its last user closes it
        store.open_table(spec)
        for k, r in _chunks(keys, rows):
            store.insert(spec.name, k, r)
        return store.nbytes(spec.name)
    finally:
        store.close()


def _rocks_db(tmp: Path, spec: TableSpec, keys: np.ndarray, rows: np.ndarray) -> int:
    import rocksdict as rd

    from hps.storage.rocks_db import RocksDBStore

    path = tmp / spec.table
    store = RocksDBStore(str(path))
    store.open_table(spec)
    for k, r in _chunks(keys, rows):
        store.insert(spec.name, k, r)
    store.close()
    raw = rd.Options(raw_mode=True)
    names = rd.Rdict.list_cf(str(path))
    db = rd.Rdict(str(path), raw, column_families=dict.fromkeys(names, raw))
    try:
        db.get_column_family(spec.name).compact_range(None, None)
    finally:
        db.close()
    return sum(f.stat().st_size for f in path.glob("*.sst"))


def _redis(address: str) -> Measure:
    """Growth of ``used_memory`` while a table is written. The server's first writes also
    make its one-time allocations (the connection's buffers grown to the batch size, the
    allocator's arenas, ...), which would count against the first table measured: float32,
    the baseline. So the first call writes the same rows once into a throwaway table,
    flushes it, and only then measures."""
    from hps.config import VolatileDBConfig
    from hps.storage import open_store
    from hps.storage.redis_cluster import RedisStore

    def write(spec: TableSpec, keys: np.ndarray, rows: np.ndarray) -> int:
        store = open_store(VolatileDBConfig(type="redis", address=address, max_batch_size=CHUNK))
        assert isinstance(store, RedisStore)
        try:
            client = store.client
            client.flushall()
            before = int(client.info("memory")["used_memory"])
            store.open_table(spec)
            for k, r in _chunks(keys, rows):
                store.insert(spec.name, k, r)
            return int(client.info("memory")["used_memory"]) - before
        finally:
            store.client.flushall()
            store.close()

    warmed = False

    def measure(spec: TableSpec, keys: np.ndarray, rows: np.ndarray) -> int:
        nonlocal warmed
        if not warmed:
            write(dataclasses.replace(spec, table=f"{spec.table}_warmup"), keys, rows)
            warmed = True
        return write(spec, keys, rows)

    return measure


def _ctr_scores(samples: int, seed: int) -> Iterator[JSON]:
    """Scores of the demo's CTR network with its tables stored in each format vs float32."""
    from hps.ctr.demo import DEMO_MODEL, NUM_DENSE, create_demo, table_sizes, table_vectors
    from hps.ctr.network import DenseNetwork

    num_tables, max_rows, dim, per_table = 26, 20_000, 16, 4
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="hps-bench-memory-") as tmp:
        create_demo(tmp, num_tables=num_tables, max_rows=max_rows, dim=dim, seed=seed)
        net = DenseNetwork(Path(tmp) / "dense.npz", device="numpy")
    dense = rng.standard_normal((samples, NUM_DENSE), dtype=np.float32)
    pooled: dict[str, list[np.ndarray]] = {name: [] for name in ROW_DTYPES}
    for t, rows in enumerate(table_sizes(num_tables, max_rows)):
        keys = rng.integers(0, rows, (samples, per_table))
        table = table_vectors(np.arange(rows, dtype=np.int64), dim, t, seed)
        for name in ROW_DTYPES:
            fmt = FORMATS[name]
            served = fmt.decode(fmt.encode(table), dim)  # what every tier serves of that table
            pooled[name].append(served[keys].sum(axis=1))
    scores = {name: net(dense, np.concatenate(p, axis=1)) for name, p in pooled.items()}
    for name in ROW_DTYPES[1:]:
        diff = np.abs(scores[name] - scores["float32"])
        yield {
            "bench": "memory",
            "tier": "ctr_scores",
            "model": DEMO_MODEL,
            "row_dtype": name,
            "samples": samples,
            "tables": num_tables,
            "dim": dim,
            "baseline": "the same requests with float32 tables",
            "mean_abs_diff": float(f"{diff.mean():.3g}"),
            "max_abs_diff": float(f"{diff.max():.3g}"),
            "mean_score": round(float(scores["float32"].mean()), 4),
        }

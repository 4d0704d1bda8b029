"""multi_process_hash_map against the in-process hash_map: fetch/insert speed, memory, N readers.

One process loads ``--rows`` rows of ``--dim`` floats into both stores, then times
``--repeats`` random batches of ``--batch`` keys on each, alternating (baseline: ``hash_map``,
the same NumPy code without shared memory, locks or extents). Memory is the bytes each
holds per row against the raw ``8 + 4 * dim``. Last, ``--readers`` processes fetch from the
one shared segment for ``--seconds``: their total rate against one reader's, and the memory
they share against the N copies that ``hash_map`` would make.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import multiprocessing.queues as mp_queues
import multiprocessing.synchronize as mp_sync
import time
import uuid
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

import numpy as np

from hps.cli import positive_float, positive_int
from hps.storage.hash_map import HashMapStore
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.types import JSON, TableSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=positive_int, default=1_000_000)
    parser.add_argument("--dim", type=positive_int, default=64)
    parser.add_argument("--batch", type=positive_int, default=4096, help="keys per fetch / insert")
    parser.add_argument("--repeats", type=positive_int, default=50, help="timed batches per op")
    parser.add_argument("--size", type=positive_int, help="segment bytes (default: fits the rows)")
    parser.add_argument("--readers", type=positive_int, default=2, help="reader processes")
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per reader phase")
    parser.add_argument("--seed", type=int, default=7)


def run(args: argparse.Namespace) -> Iterator[JSON]:
    rng = np.random.default_rng(args.seed)
    spec = TableSpec(model="bench", table="t", dim=args.dim)
    keys = rng.permutation(args.rows).astype(np.int64) * 7919 + 1
    values = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    size = args.size or max(64 << 20, int(2 * args.rows * SharedHashMapStore.bytes_per_row(
        4 * args.dim)))  # fmt: skip
    name = f"hps_bench_{uuid.uuid4().hex[:8]}"
    shared = SharedHashMapStore(name, size, max_batch_size=65536)
    local = HashMapStore()
    try:
        common = {"bench": "shm", "rows": args.rows, "dim": args.dim, "batch": args.batch,
                  "baseline": "hash_map (in-process)"}  # fmt: skip
        load = {}
        for label, store in (("load_s", shared), ("baseline_load_s", local)):
            store.open_table(spec)
            t0 = time.perf_counter()
            for lo in range(0, args.rows, 65536):
                store.insert(spec.name, keys[lo : lo + 65536], values[lo : lo + 65536])
            load[label] = round(time.perf_counter() - t0, 3)
        for op in ("fetch", "insert"):
            ours, base = _time(op, shared, local, spec, keys, values, args, rng)
            n = args.repeats * args.batch
            yield {**common, **load, "op": op, "keys_per_s": round(n / ours),
                   "baseline_keys_per_s": round(n / base),
                   "ratio": round(base / ours, 3)}  # fmt: skip
        raw = 8 + 4 * args.dim
        ours_b, base_b = shared.nbytes(spec.name) / args.rows, local.nbytes(spec.name) / args.rows
        yield {**common, "op": "memory", "bytes_per_row": round(ours_b, 1),
               "baseline_bytes_per_row": round(base_b, 1), "raw_bytes_per_row": raw,
               "ratio_to_raw": round(ours_b / raw, 3),
               "extent_bytes": shared.stats()["extent_bytes"]}  # fmt: skip
        local.close()
        yield {**common, **_readers(name, size, spec, keys, args, ours_b * args.rows)}
    finally:
        local.close()
        shared.close()


def _time(
    op: str, shared: SharedHashMapStore, local: HashMapStore, spec: TableSpec,
    keys: np.ndarray, values: np.ndarray, args: argparse.Namespace, rng: np.random.Generator,
) -> tuple[float, float]:  # fmt: skip
    spent = [0.0, 0.0]
    for r in range(args.repeats + 1):  # round 0 warms up
        idx = rng.integers(0, keys.size, args.batch)
        k, v = keys[idx], values[idx] + np.float32(r)
        for slot in (0, 1) if r % 2 else (1, 0):
            store = (shared, local)[slot]
            t0 = time.perf_counter()
            if op == "fetch":
                store.fetch(spec.name, k)
            else:
                store.insert(spec.name, k, v)
            if r:
                spent[slot] += time.perf_counter() - t0
    return spent[0], spent[1]


def _reader(name: str, size: int, dim: int, keys: np.ndarray, batch: int, seconds: float,
            start: mp_sync.Barrier, out: mp_queues.Queue[float]) -> None:  # fmt: skip
    store = SharedHashMapStore(name, size)
    spec = TableSpec(model="bench", table="t", dim=dim)
    store.open_table(spec)
    rng = np.random.default_rng()
    start.wait()
    n, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        store.fetch(spec.name, keys[rng.integers(0, keys.size, batch)])
        n += batch
    out.put(n / seconds)
    store.close()


def _readers(name: str, size: int, spec: TableSpec, keys: np.ndarray, args: argparse.Namespace,
             shared_bytes: float) -> JSON:  # fmt: skip
    ctx = mp.get_context("spawn")
    rates = {}
    procs: list[BaseProcess] = []
    try:
        for n in sorted({1, args.readers}):
            start, out = ctx.Barrier(n + 1, timeout=120), ctx.Queue()
            procs = [ctx.Process(target=_reader, args=(name, size, spec.dim, keys, args.batch,
                                                       args.seconds, start, out))
                     for _ in range(n)]  # fmt: skip
            for p in procs:
                p.start()
            start.wait()
            rates[n] = sum(out.get(timeout=120 + args.seconds) for _ in procs)
            for p in procs:
                p.join()
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM) or a reader failed: stop the readers before the
        # caller closes the segment, so that its close is the last and removes the files.
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(30)
        raise
    local_copy = HashMapStore.bytes_per_row(spec.fmt.row_bytes(spec.dim)) * args.rows
    return {"op": "fetch_processes", "processes": args.readers,
            "keys_per_s": round(rates[args.readers]), "one_process_keys_per_s": round(rates[1]),
            "scaling": round(rates[args.readers] / rates[1], 2),
            "shared_bytes": round(shared_bytes),
            "hash_map_copies_bytes": round(local_copy * args.readers)}  # fmt: skip

"""``hps bench cache --mode throughput``: query and insert against a raw take and scatter
on the same array module, and on a GPU its own rows (:mod:`hps.bench.cache_gpu`); the
options and what they mean: :mod:`hps.bench.cache`."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from hps.bench.cache_gpu import device_name, gpu_rows
from hps.bench.cache_hitrate import zipf_probabilities
from hps.bench.cache_tables import TablesRequest
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.kernels import kernel_for
from hps.cache.xp import select_xp, to_host, to_xp
from hps.dedup import unique_inverse
from hps.rowformat import FLOAT32, ROW_DTYPES, RowFormat, row_format
from hps.types import JSON, ArrayModule


def _time(fns: list[Callable[[], object]], repeats: int, sync: Callable[[], None]) -> list[float]:
    """Median seconds of each of ``fns``, run in turn ``repeats`` times (after a warm-up)."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(repeats + 1):
        for fn, out in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            sync()
            if i:
                out.append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def throughput(args: argparse.Namespace) -> Iterator[JSON]:
    xp = select_xp(args.device)
    sync: Callable[[], None] = (
        (lambda: None) if xp is np else (lambda: xp.cuda.Stream.null.synchronize())
    )
    rng = np.random.default_rng(args.seed)
    rows, dim = args.rows, args.dim
    n = args.tables * args.batch_per_table
    resident = rng.choice(1 << 40, size=rows, replace=False).astype(np.int64) + 1
    values = rng.standard_normal((rows, dim), dtype=np.float32)
    if args.key_alpha > 0:
        pick = np.searchsorted(np.cumsum(zipf_probabilities(rows, args.key_alpha)), rng.random(n))
        pick = pick.clip(0, rows - 1)
    else:
        pick = rng.integers(0, rows, n)
    batch = resident[pick]
    names = ROW_DTYPES if args.row_dtype == "all" else (args.row_dtype,)
    formats = [row_format(name) for name in names]
    for policy in args.policies:
        caches: dict[str, EmbeddingCache] = {}
        for fmt in formats:
            cache = EmbeddingCache(dim, rows, xp=xp, policy=policy, fmt=fmt)
            cache.insert(resident, fmt.encode(values))
            caches[fmt.name] = cache
            yield from _query_throughput(args, xp, sync, policy, cache, batch)
            yield from _insert_throughput(args, xp, sync, policy, resident, values, fmt)
            if xp is not np and kernel_for(xp) is not None:
                unique = np.unique(batch).size / n
                row = partial(_gpu_row, policy, xp, n, unique, fmt.name)
                cpu_cache = _filled(np, policy, fmt, resident, values)
                timer = partial(_time, repeats=args.repeats, sync=sync)
                yield from gpu_rows(args, xp, timer, row, cache, cpu_cache, batch)
            if args.tables > 1 and xp is np and kernel_for(np) is not None:
                yield from _tables_throughput(args, policy, fmt, resident, values, pick)
        if any(fmt is not FLOAT32 for fmt in formats):
            yield from _against_float32(args, xp, sync, policy, caches, resident, values, batch)
            if args.tables > 1 and xp is np:
                yield from _tables_against_float32(args, policy, formats, resident, values, pick)


def _query_throughput(
    args: argparse.Namespace,
    xp: ArrayModule,
    sync: Callable[[], None],
    policy: str,
    cache: EmbeddingCache,
    batch: np.ndarray,
) -> Iterator[JSON]:
    """``query_into``, the NumPy reference and query-then-expand vs. a raw take."""
    dim, n = cache.dim, batch.size
    # The baseline reads the cache's own arena at rows known in advance.
    arena = cache._rows.values
    idx = cache._rows.lookup(to_xp(xp, batch))

    def ours() -> None:
        cache.query_into(batch, np.empty((batch.size, dim), dtype=np.float32))

    def reference() -> None:
        uniq, inverse = unique_inverse(batch)
        cache.query(uniq, inverse)

    def ours_expand() -> None:
        uniq, inverse = unique_inverse(batch)
        vals, _ = cache.query(uniq)
        vals[inverse]

    def raw() -> None:
        to_host(arena.take(idx, axis=0))

    fns: list[Callable[[], object]] = [ours, reference, ours_expand, raw]
    t_ours, t_ref, t_expand, t_raw = _time(fns, args.repeats, sync)
    unique = np.unique(batch).size / n
    kernel = "compiled" if kernel_for(xp) is not None else "numpy"
    fmt = cache.fmt.name
    yield _row("query", policy, xp, n, t_ours, t_raw, unique, fmt) | {"kernel": kernel}
    yield _row("query_numpy", policy, xp, n, t_ref, t_raw, unique, fmt)
    yield _row("query_then_expand", policy, xp, n, t_expand, t_raw, unique, fmt)


def _against_float32(
    args: argparse.Namespace,
    xp: ArrayModule,
    sync: Callable[[], None],
    policy: str,
    caches: dict[str, EmbeddingCache],
    resident: np.ndarray,
    values: np.ndarray,
    batch: np.ndarray,
) -> Iterator[JSON]:
    """All-hit ``query_into`` of each quantized cache against a float32 cache of the same
    rows, timed in turn in the same loop (so both see the same machine)."""
    if "float32" not in caches:
        caches = {"float32": _filled(xp, policy, FLOAT32, resident, values)} | caches
    out = np.empty((batch.size, caches["float32"].dim), dtype=np.float32)
    names = list(caches)
    fns: list[Callable[[], object]] = [
        partial(caches[name].query_into, batch, out) for name in names
    ]
    times = dict(zip(names, _time(fns, args.repeats, sync), strict=True))
    unique = np.unique(batch).size / batch.size
    for name in names:
        if name != "float32":
            row = _row("query_vs_float32", policy, xp, batch.size, times[name],
                       times["float32"], unique, name)  # fmt: skip
            yield row | {
                "dim": int(out.shape[1]),
                "kernel": "compiled" if kernel_for(xp) else "numpy",
            }


def _tables_throughput(
    args: argparse.Namespace,
    policy: str,
    fmt: RowFormat,
    resident: np.ndarray,
    values: np.ndarray,
    pick: np.ndarray,
) -> Iterator[JSON]:
    """``query_tables``: the many-table call (one compiled call for every table, as a lookup
    probes) against one ``query_into`` per table on the same keys, timed in turn (``ratio``
    > 1: the one call is faster)."""
    dim = values.shape[1]
    req = TablesRequest.of(args, resident, dim, pick)
    tables = req.tables(policy, fmt, resident, values)
    many, one_by_one = partial(req.many, tables), partial(req.one_by_one, tables)
    t_many, t_each = _time([many, one_by_one], args.repeats, lambda: None)
    unique = np.unique(req.keys).size / req.keys.size
    row = _row("query_tables", policy, np, req.keys.size, t_many, t_each, unique, fmt.name)
    yield row | {"dim": dim, "tables": args.tables}


def _tables_against_float32(
    args: argparse.Namespace,
    policy: str,
    formats: list[RowFormat],
    resident: np.ndarray,
    values: np.ndarray,
    pick: np.ndarray,
) -> Iterator[JSON]:
    """The many-table call over ``--tables`` caches per format against float32's."""
    dim = values.shape[1]
    req = TablesRequest.of(args, resident, dim, pick)
    names = ["float32", *(f.name for f in formats if f is not FLOAT32)]
    tables = {name: req.tables(policy, row_format(name), resident, values) for name in names}
    fns: list[Callable[[], object]] = [partial(req.many, tables[name]) for name in names]
    times = dict(zip(names, _time(fns, args.repeats, lambda: None), strict=True))
    unique = np.unique(req.keys).size / req.keys.size
    for name in names[1:]:
        row = _row("query_tables_vs_float32", policy, np, req.keys.size, times[name],
                   times["float32"], unique, name)  # fmt: skip
        yield row | {"dim": dim, "tables": args.tables}


def _filled(
    xp: ArrayModule, policy: str, fmt: RowFormat, resident: np.ndarray, values: np.ndarray
) -> EmbeddingCache:
    cache = EmbeddingCache(values.shape[1], resident.size, xp=xp, policy=policy, fmt=fmt)
    cache.insert(resident, fmt.encode(values))
    return cache


def _insert_throughput(
    args: argparse.Namespace,
    xp: ArrayModule,
    sync: Callable[[], None],
    policy: str,
    resident: np.ndarray,
    values: np.ndarray,
    fmt: RowFormat = FLOAT32,
) -> Iterator[JSON]:
    """Inserts of ``n`` new keys into a full cache (each evicts) vs. a raw row scatter:
    ``insert`` as a lookup's fill inserts (``force=False``: ``frequency`` admits by its
    estimates) and, for a policy with admission, ``insert_forced`` as warm-up and prefetch
    do (``force=True``), timed in turn on twin caches. ``admitted``: the share of the keys
    offered that the timed inserts stored."""
    n = args.tables * args.batch_per_table
    rows = resident.size
    fill = _filled(xp, policy, fmt, resident, values)
    cases = {"insert": (fill, False)}
    if fill.policy.admission:
        cases["insert_forced"] = (_filled(xp, policy, fmt, resident, values), True)
    fresh = iter(range(1 << 41, 1 << 62, n))
    new_vals = fmt.encode(values[:n])

    def ours(cache: EmbeddingCache, force: bool) -> None:
        lo = next(fresh)
        cache.insert(np.arange(lo, lo + n, dtype=np.int64), new_vals, force=force)

    arena = xp.zeros((rows, fill.width), dtype=fmt.dtype)
    target = to_xp(xp, np.random.default_rng(1).choice(rows, n, replace=False))

    def raw() -> None:
        arena[target] = to_xp(xp, new_vals)

    before = {op: int(cache.stats()["inserts"]) for op, (cache, _) in cases.items()}
    fns: list[Callable[[], object]] = [partial(ours, *case) for case in cases.values()]
    *t_ours, t_raw = _time([*fns, raw], args.repeats, sync)
    for (op, (cache, force)), t in zip(cases.items(), t_ours, strict=True):
        stored = int(cache.stats()["inserts"]) - before[op]
        row = _row(op, policy, xp, n, t, t_raw, 1.0, fmt.name)
        yield row | {"force": force, "admitted": round(stored / (n * (args.repeats + 1)), 4)}


def _gpu_row(policy: str, xp: ArrayModule, n: int, unique: float, row_dtype: str, op: str,
             t_ours: float, t_raw: float) -> JSON:  # fmt: skip
    """:func:`_row` with the case first (for :func:`hps.bench.cache_gpu.gpu_rows`)."""
    return _row(op, policy, xp, n, t_ours, t_raw, unique, row_dtype)


def _row(
    op: str,
    policy: str,
    xp: ArrayModule,
    n: int,
    t_ours: float,
    t_raw: float,
    unique: float,
    row_dtype: str = "float32",
) -> JSON:
    return {
        "bench": "cache.throughput",
        "op": op,
        "policy": policy,
        "row_dtype": row_dtype,
        "keys": n,
        "unique_fraction": round(unique, 4),
        "keys_per_s": round(n / t_ours),
        "baseline_keys_per_s": round(n / t_raw),
        "ratio": round(t_raw / t_ours, 4),
        "device": xp.__name__,
        "device_name": device_name(xp),
    }

"""L1 cache: each policy's hit rate against the oracle, and query/insert throughput vs. a raw take.

``--mode hitrate`` replays synthetic key streams through the cache in batches (dedup, query,
insert the misses) and compares the hit rate with the oracle:

- ``zipf``: independent draws from a Zipf law over ``--keys`` distinct keys; the oracle is the
  exact sum of the probabilities of the cache-sized most popular keys (the best static cache).
- ``drift``: the same law, but every phase moves the hot set: the ranks slide down by
  ``--drift-shift`` keys and as many cold keys become the hottest. The oracle is the best
  static choice per phase.

The first ``--warmup`` fraction of each stream (one phase of the drifting one) fills the cache
and is left out of ``hit_rate``; ``hit_rate_all`` counts every access.

``--mode throughput`` times all-hit queries of ``--tables`` x ``--batch-per-table`` keys at
``--dim`` against a raw ``take`` of the same rows with precomputed indices on the same array
module, and inserts against a raw scatter of the same rows. ``query`` is what a lookup runs
(``EmbeddingCache.query_into``: the compiled probe+gather when numba / CuPy is there, rows
in request order); ``query_numpy`` is the NumPy reference path (dedup with
``hps.dedup.unique_inverse``, query, expansion to request order); ``kernel`` names which
ran as ``query``.

``--row-dtype`` (``float32``, ``float16``, ``int8`` or ``all``) stores the rows in that format
(:mod:`hps.rowformat`; the arena holds stored rows, ``query_into`` dequantizes as it
gathers). Every format other than float32 is also compared with a float32 cache of the same
rows in the same run: ``op`` ``query_vs_float32`` gives both caches' all-hit ``query_into``
speeds, timed in turn, and their ratio (``ratio``: float32's time / this format's; 1.0 is
as fast as float32). With ``--tables`` > 1, ``query_tables_vs_float32`` does the same for
the many-table call a lookup makes (:func:`hps.cache.many.query_tables_into`): ``--tables``
caches of ``--rows`` / ``--tables`` rows each, ``--batch-per-table`` keys from each.

With ``--device cupy`` (or ``auto`` on a GPU) the same run also prints the GPU's own rows
(:mod:`hps.bench.cache_gpu`): the kernel alone against a raw take on the device
(``query_device``), ``query_into`` against its host-path floor (``query_host_floor``), against
the CPU kernel on the same batch (``query_vs_cpu``), and the many-table call against one call
per table (``query_tables``). Every row names the device it ran on (``device_name``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from hps.bench.cache_gpu import device_name, gpu_rows
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.kernels import kernel_for
from hps.cache.many import query_tables_into
from hps.cache.policies import POLICIES
from hps.cache.xp import select_xp, to_host, to_xp
from hps.dedup import unique_inverse
from hps.rowformat import FLOAT32, ROW_DTYPES, RowFormat, row_format
from hps.types import JSON, ArrayModule


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("hitrate", "throughput"), default="hitrate")
    parser.add_argument("--device", choices=("auto", "numpy", "cupy"), default="numpy")
    parser.add_argument("--seed", type=int, default=7)
    h = parser.add_argument_group("hitrate")
    h.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    h.add_argument(
        "--accesses", type=int, default=0, help="stream length (0: max(4M, 60 x cache rows))"
    )
    h.add_argument("--batch", type=int, default=8192, help="accesses per lookup batch")
    h.add_argument("--alphas", default="0.9,1.1,1.3")
    h.add_argument("--ratios", default="0.01,0.05,0.2", help="cache rows / distinct keys")
    h.add_argument("--policies", default=",".join(POLICIES))
    h.add_argument("--streams", default="zipf,drift")
    h.add_argument("--phases", type=int, default=4, help="phases of the drifting stream")
    h.add_argument("--drift-shift", type=float, default=0.01, help="hot-set move, x keys")
    h.add_argument("--warmup", type=float, default=0.25, help="fraction left out of hit_rate")
    t = parser.add_argument_group("throughput")
    t.add_argument("--tables", type=int, default=26)
    t.add_argument("--batch-per-table", type=int, default=1024)
    t.add_argument("--dim", type=int, default=128)
    t.add_argument("--rows", type=int, default=1 << 18, help="resident rows")
    t.add_argument("--key-alpha", type=float, default=0.0, help="0: uniform keys, else Zipf")
    t.add_argument("--repeats", type=int, default=30)
    t.add_argument(
        "--row-dtype",
        choices=(*ROW_DTYPES, "all"),
        default="float32",
        help="row format of the cache (all: each); others are compared with float32",
    )


def run(args: argparse.Namespace) -> Iterator[JSON]:
    if args.mode == "throughput":
        yield from _throughput(args)
    else:
        yield from _hitrate(args)


# -- hit rate ------------------------------------------------------------------------------


def zipf_probabilities(n: int, alpha: float) -> np.ndarray:
    """p[r] of rank r (0 = hottest) under a Zipf law over ``n`` keys."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return w / w.sum()


def oracle_hit_rate(p: np.ndarray, capacity: int) -> float:
    """Best static cache: the probability mass of the ``capacity`` most popular keys."""
    return float(np.sort(p)[::-1][:capacity].sum())


def zipf_stream(
    p: np.ndarray, length: int, rng: np.random.Generator, phases: int = 1, shift: int = 0
) -> np.ndarray:
    """Keys of ``length`` accesses; phase ``k`` gives rank ``r`` the key of rank ``r - k*shift``."""
    n = p.size
    key_of_rank = rng.permutation(n).astype(np.int64) * 2654435761 % (1 << 48) + 1
    cdf = np.cumsum(p)
    cdf[-1] = 1.0
    ranks = np.searchsorted(cdf, rng.random(length), side="right").clip(0, n - 1)
    phase = np.arange(length) * phases // length
    return key_of_rank[(ranks - phase * shift) % n]


def replay(cache: EmbeddingCache, stream: np.ndarray, batch: int, skip: int) -> tuple[float, float]:
    """(hit rate after the first ``skip`` accesses, hit rate over all) of batched lookups."""
    zeros = np.zeros((batch, cache.dim), dtype=np.float32)
    hits = hits_all = 0
    for lo in range(0, stream.size, batch):
        chunk = stream[lo : lo + batch]
        uniq, inverse = np.unique(chunk, return_inverse=True)
        _, hit = cache.query(uniq, inverse)
        n_hit = int(hit[inverse].sum())
        hits_all += n_hit
        if lo >= skip:
            hits += n_hit
        miss = uniq[~hit]
        if miss.size:
            cache.insert(miss, zeros[: miss.size])
    measured = stream.size - min(skip, stream.size)
    return hits / max(1, measured), hits_all / max(1, stream.size)


def _hitrate(args: argparse.Namespace) -> Iterator[JSON]:
    xp = select_xp(args.device)
    policies = [p for p in args.policies.split(",") if p]
    ratios = [float(r) for r in args.ratios.split(",") if r]
    n = args.keys
    for alpha in (float(a) for a in args.alphas.split(",") if a):
        p = zipf_probabilities(n, alpha)
        for kind in (s for s in args.streams.split(",") if s):
            drift = kind == "drift"
            phases = args.phases if drift else 1
            shift = int(args.drift_shift * n) if drift else 0
            streams: dict[int, np.ndarray] = {}
            for ratio in ratios:
                capacity = max(1, int(ratio * n))
                length = args.accesses or max(4_000_000, 60 * capacity)
                if length not in streams:
                    rng = np.random.default_rng(args.seed)
                    streams[length] = zipf_stream(p, length, rng, phases, shift)
                stream = streams[length]
                # The drifting stream's first phase fills the cache; the others are measured.
                warm = 1 / phases if drift else args.warmup
                skip = int(warm * stream.size) // args.batch * args.batch
                oracle = oracle_hit_rate(p, capacity)  # the same law in every phase
                for policy in policies:
                    cache = EmbeddingCache(4, capacity, xp=xp, policy=policy)
                    start = time.perf_counter()
                    rate, rate_all = replay(cache, stream, args.batch, skip)
                    yield {
                        "bench": "cache.hitrate",
                        "policy": policy,
                        "stream": kind,
                        "alpha": alpha,
                        "keys": n,
                        "accesses": int(stream.size),
                        "batch": args.batch,
                        "cache_ratio": ratio,
                        "capacity": capacity,
                        "hit_rate": round(rate, 5),
                        "hit_rate_all": round(rate_all, 5),
                        "oracle_hit_rate": round(oracle, 5),
                        "ratio": round(rate / oracle, 4),
                        "device": xp.__name__,
                        "seconds": round(time.perf_counter() - start, 2),
                    }


# -- throughput ----------------------------------------------------------------------------


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


def _throughput(args: argparse.Namespace) -> Iterator[JSON]:
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
    for policy in (p for p in args.policies.split(",") if p):
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


def _tables_against_float32(
    args: argparse.Namespace,
    policy: str,
    formats: list[RowFormat],
    resident: np.ndarray,
    values: np.ndarray,
    pick: np.ndarray,
) -> Iterator[JSON]:
    """The many-table call over ``--tables`` caches per format against float32's."""
    n_tables, per = args.tables, args.batch_per_table
    size = max(1, resident.size // n_tables)
    parts = [slice(t * size, (t + 1) * size) for t in range(n_tables)]
    keys = np.concatenate(
        [resident[part][pick[t * per : (t + 1) * per] % size] for t, part in enumerate(parts)]
    )
    bounds = np.stack([np.arange(n_tables) * per, np.arange(1, n_tables + 1) * per], axis=1)
    dim = values.shape[1]
    offsets = np.arange(n_tables, dtype=np.int64) * per * dim
    out = np.empty(keys.size * dim, dtype=np.float32)
    names = ["float32", *(f.name for f in formats if f is not FLOAT32)]
    tables = {
        name: [
            _filled(np, policy, row_format(name), resident[part], values[part]) for part in parts
        ]
        for name in names
    }
    fns: list[Callable[[], object]] = [
        partial(query_tables_into, tables[name], keys, bounds, out, offsets) for name in names
    ]
    times = dict(zip(names, _time(fns, args.repeats, lambda: None), strict=True))
    unique = np.unique(keys).size / keys.size
    for name in names[1:]:
        row = _row("query_tables_vs_float32", policy, np, keys.size, times[name],
                   times["float32"], unique, name)  # fmt: skip
        yield row | {"dim": dim, "tables": n_tables}


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
    """Inserts of ``n`` new keys into a full cache (each evicts) vs. a raw row scatter."""
    n = args.tables * args.batch_per_table
    rows = resident.size
    cache = _filled(xp, policy, fmt, resident, values)
    fresh = iter(range(1 << 41, 1 << 62, n))
    new_vals = fmt.encode(values[:n])

    def ours() -> None:
        lo = next(fresh)
        cache.insert(np.arange(lo, lo + n, dtype=np.int64), new_vals, force=True)

    arena = xp.zeros((rows, cache.width), dtype=fmt.dtype)
    target = to_xp(xp, np.random.default_rng(1).choice(rows, n, replace=False))

    def raw() -> None:
        arena[target] = to_xp(xp, new_vals)

    t_ours, t_raw = _time([ours, raw], args.repeats, sync)
    yield _row("insert", policy, xp, n, t_ours, t_raw, 1.0, fmt.name)


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

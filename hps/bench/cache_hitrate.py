"""``hps bench cache --mode hitrate``: each policy's hit rate against the oracle
(the options and what they mean: :mod:`hps.bench.cache`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import numpy as np

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.xp import select_xp
from hps.types import JSON


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


def hitrate(args: argparse.Namespace) -> Iterator[JSON]:
    xp = select_xp(args.device)
    policies: list[str] = args.policies
    ratios: list[float] = args.ratios
    n = args.keys
    for alpha in args.alphas:
        p = zipf_probabilities(n, alpha)
        for kind in args.streams:
            drift = kind == "drift"
            phases = args.phases if drift else 1
            shift = int(args.drift_shift * n) if drift else 0
            streams: dict[int, np.ndarray] = {}
            for ratio in ratios:
                capacity = int(ratio * n)  # 1 or more (hps.bench.cache.check_arguments)
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

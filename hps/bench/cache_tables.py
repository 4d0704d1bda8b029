"""The many-table request of ``hps bench cache --mode throughput`` on NumPy: ``--tables``
caches of ``--rows`` / ``--tables`` resident rows each and ``--batch-per-table`` keys from
each, probed by one compiled call (:func:`hps.cache.many.query_tables_into`, as a lookup
probes) or by one ``query_into`` per table (:mod:`hps.bench.cache_throughput` times them)."""

from __future__ import annotations

import argparse
from typing import NamedTuple

import numpy as np

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.many import query_tables_into
from hps.rowformat import RowFormat


class TablesRequest(NamedTuple):
    """A request over ``--tables`` tables, laid out as :func:`query_tables_into` takes it."""

    parts: list[slice]  # each table's share of the resident rows
    keys: np.ndarray
    bounds: np.ndarray  # each table's first and end key
    offsets: np.ndarray  # where each table's rows start in ``out``
    out: np.ndarray  # float32, every row of the request
    segments: list[tuple[int, int, int]]  # bounds and offset of each table, as ints

    @classmethod
    def of(
        cls, args: argparse.Namespace, resident: np.ndarray, dim: int, pick: np.ndarray
    ) -> TablesRequest:
        """Table ``t`` holds the ``t``-th share of ``resident``; its keys are ``pick``'s
        ``t``-th ``--batch-per-table`` positions, taken within that share."""
        n_tables, per = args.tables, args.batch_per_table
        size = max(1, resident.size // n_tables)
        parts = [slice(t * size, (t + 1) * size) for t in range(n_tables)]
        keys = np.concatenate(
            [resident[part][pick[t * per : (t + 1) * per] % size] for t, part in enumerate(parts)]
        )
        bounds = np.stack([np.arange(n_tables) * per, np.arange(1, n_tables + 1) * per], axis=1)
        offsets = np.arange(n_tables, dtype=np.int64) * per * dim
        segments = [(t * per, (t + 1) * per, t * per * dim) for t in range(n_tables)]
        out = np.empty(keys.size * dim, dtype=np.float32)
        return cls(parts, keys, bounds, offsets, out, segments)

    def tables(
        self, policy: str, fmt: RowFormat, resident: np.ndarray, values: np.ndarray
    ) -> list[EmbeddingCache]:
        """One NumPy cache per table, holding its share of the rows (float32 ``values``)."""
        out = []
        for part in self.parts:
            cache = EmbeddingCache(values.shape[1], part.stop - part.start, policy=policy, fmt=fmt)
            cache.insert(resident[part], fmt.encode(values[part]))
            out.append(cache)
        return out

    def many(self, tables: list[EmbeddingCache]) -> None:
        """The request through the one compiled call."""
        query_tables_into(tables, self.keys, self.bounds, self.out, self.offsets)

    def one_by_one(self, tables: list[EmbeddingCache]) -> None:
        """The request through one ``query_into`` per table, into the same places."""
        for table, (lo, hi, off) in zip(tables, self.segments, strict=True):
            rows = self.out[off : off + (hi - lo) * table.dim].reshape(hi - lo, table.dim)
            table.query_into(self.keys[lo:hi], rows)

"""The fused lookup of a whole Triton request (ps.json ``fuse_embedding_table``, on by default).

:meth:`hps.lookup.LookupSession.lookup_request` answers HugeCTR's request shape (the flat
keys of all tables of a model and the keys per table) with one flat output. The reference
path looks each table up on its own: de-duplicate, probe, gather, expand to request order,
then copy into the output. The fused path allocates the output once and lets the L1 caches
write each table's rows straight into that table's slice of it in request order: one
compiled call for all tables (:func:`hps.cache.many.query_tables_into`) where the caches
allow it, else :meth:`hps.cache.EmbeddingCache.query_into` per table (either way one pass
over the keys that probes, gathers and does the L1 bookkeeping, no de-duplication); then it
sends each table's misses to L2/L3 in one batch (de-duplicated there) and writes those rows
into place.

The contract is the reference's: vectors in request order, exact values, defaults only
where no tier holds a key, the same backfill and hit-rate threshold, and the same counters
(distinct keys per level). ``bench triton`` measured both (docs/serving.md); the fused path
is the default, ``"fuse_embedding_table": false`` selects the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hps.cache.many import query_tables_into
from hps.dedup import unique_inverse
from hps.types import Keys, TableSpec, Vectors

if TYPE_CHECKING:
    from hps.lookup import L1Cache, LookupSession


class FusedLookup:
    """Answers ``lookup_request`` for a session with one output buffer and in-place writes."""

    def __init__(self, session: LookupSession) -> None:
        self.session = session

    def lookup(self, specs: Sequence[TableSpec], keys: Keys, counts: list[int]) -> Vectors:
        """Flat vectors of already validated ``keys`` (``counts[i]`` for table ``i``)."""
        session = self.session
        total = sum(n * s.dim for s, n in zip(specs, counts, strict=True))
        out = np.empty(total, dtype=np.float32)
        pending: list[tuple[TableSpec, L1Cache | None, Keys, Vectors, np.ndarray, int]] = []
        cached: list[tuple[TableSpec, L1Cache, int, int, int]] = []  # spec, cache, k, n, v
        k_off = v_off = 0
        for spec, n in zip(specs, counts, strict=True):
            if n:
                cache = session.caches.get(spec.name)
                if cache is None:
                    session.count(spec.name, lookups=1, keys=n)
                    view = out[v_off : v_off + n * spec.dim].reshape(n, spec.dim)
                    pending.append((spec, None, keys[k_off : k_off + n], view, np.arange(n), 0))
                else:
                    cached.append((spec, cache, k_off, n, v_off))
            k_off += n
            v_off += n * spec.dim
        for (spec, cache, k, n, v), (miss_pos, n_hit) in zip(
            cached, self._probe(cached, keys, out), strict=True
        ):
            session.count(spec.name, lookups=1, keys=n, l1=n_hit)
            if miss_pos.size:
                view = out[v : v + n * spec.dim].reshape(n, spec.dim)
                pending.append((spec, cache, keys[k : k + n], view, miss_pos, n_hit))
        for spec, cache, seg, view, miss_pos, n_hit in pending:
            # L2 → L3 → default for the missed positions, de-duplicated, then L1 backfill
            missed, inverse = unique_inverse(seg[miss_pos])
            view[miss_pos] = session.miss_rows(spec, cache, missed, n_hit)[inverse]
        return out

    @staticmethod
    def _probe(
        cached: list[tuple[TableSpec, L1Cache, int, int, int]], keys: Keys, out: Vectors
    ) -> list[tuple[np.ndarray, int]]:
        """L1 of every cached table: one compiled call for all of them where the caches
        allow (:func:`hps.cache.many.query_tables_into`), else one ``query_into`` each."""
        if not cached:
            return []
        bounds = np.array([(k, k + n) for _, _, k, n, _ in cached], dtype=np.int64)
        offsets = np.array([v for *_, v in cached], dtype=np.int64)
        answers = query_tables_into([c for _, c, *_ in cached], keys, bounds, out, offsets)
        if answers is not None:
            return answers
        return [
            cache.query_into(keys[k : k + n], out[v : v + n * spec.dim].reshape(n, spec.dim))
            for spec, cache, k, n, v in cached
        ]

"""The fused lookup of a whole Triton request (ps.json ``fuse_embedding_table``, on by default).

:meth:`hps.lookup.LookupSession.lookup_request` answers HugeCTR's request shape (the flat
keys of all tables of a model and the keys per table) with one flat output. The reference
path looks each table up on its own: de-duplicate, probe, gather, expand to request order,
then copy into the output. The fused path allocates the output once and, per table, lets
the L1 cache write the rows straight into that table's slice of it in request order
(:meth:`hps.cache.EmbeddingCache.query_into`: with a compiled kernel, one pass over the keys
that probes, gathers and does the L1 bookkeeping, no de-duplication); then it sends each
table's misses to L2/L3 in one batch (de-duplicated there) and writes those rows into place.

The contract is the reference's: vectors in request order, exact values, defaults only
where no tier holds a key, the same backfill and hit-rate threshold, and the same counters
(distinct keys per level). ``bench triton`` measured both (docs/serving.md); the fused path
is the default, ``"fuse_embedding_table": false`` selects the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

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
        k_off = v_off = 0
        for spec, n in zip(specs, counts, strict=True):
            seg = keys[k_off : k_off + n]
            view = out[v_off : v_off + n * spec.dim].reshape(n, spec.dim)
            k_off += n
            v_off += n * spec.dim
            if n == 0:
                continue
            session.count(spec.name, lookups=1, keys=n)
            cache = session.caches.get(spec.name)
            if cache is None:
                pending.append((spec, None, seg, view, np.arange(n), 0))
                continue
            miss_pos, n_hit = cache.query_into(seg, view)
            session.count(spec.name, l1=n_hit)
            if miss_pos.size:
                pending.append((spec, cache, seg, view, miss_pos, n_hit))
        for spec, cache, seg, view, miss_pos, n_hit in pending:
            # L2 → L3 → default for the missed positions, de-duplicated, then L1 backfill
            missed, inverse = unique_inverse(seg[miss_pos])
            view[miss_pos] = session.miss_rows(spec, cache, missed, n_hit)[inverse]
        return out

"""Which keys the load-test users send, and which of them are checked.

Keys come from the real keys of the ps.json's tables (the sparse files: a random
:data:`MAX_KEYS` of a larger table; else L3: its first :data:`MAX_KEYS`), drawn by a
Zipf law over the keys in file order (rank 1 is the first key; exponent ``zipf``; 0 is
uniform).

Every key falls in one of three classes by a hash of the key (:func:`key_class`): ``BULK``
keys receive the publisher's bulk updates, ``FRESH`` keys the freshness probes, and all the
others are never updated, so their vectors are known: ``VERIFY_POOL`` of them per table are
kept with their vectors, to be planted in requests and checked in the answers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hps.errors import ConfigError
from hps.types import TableSpec

if TYPE_CHECKING:
    from hps.tiers import Tiers

CLASSES = 16
BULK, FRESH = 0, 1  # key classes that updates touch; every other class is verified
VERIFY_POOL = 4096  # known vectors kept per table
MAX_KEYS = 1 << 20  # keys per table drawn from (larger tables: see from_sparse, from_l3)


def key_class(keys: np.ndarray) -> np.ndarray:
    """``0 .. CLASSES - 1`` per key (splitmix64 of the key), the same in every process."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(CLASSES)).astype(np.int64)


def zipf_probabilities(n: int, exponent: float) -> np.ndarray:
    """Probabilities of ranks ``1..n`` under Zipf(``exponent``), any exponent >= 0."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -float(exponent)
    return weights / weights.sum()


def alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of probabilities ``p``: draw a column ``i`` uniformly, keep it
    with probability ``prob[i]``, else take ``alias[i]``; each ``x`` is drawn with ``p[x]``.

    Built by the sweep (light columns, ``n * p < 1``, are topped up by the heavy ones in
    order), written with prefix sums instead of a loop: light ``k`` takes from the heavy
    whose cumulative excess first passes the lights' cumulative deficit before ``k``, and
    each heavy keeps what the lights before the next one leave it, topped up by that one.
    """
    n = p.size
    q = p * (n / p.sum())
    prob, alias = np.ones(n), np.arange(n, dtype=np.int64)
    light, heavy = np.flatnonzero(q < 1.0), np.flatnonzero(q >= 1.0)
    if not light.size or not heavy.size:
        return prob, alias
    deficit = 1.0 - q[light]
    ends = np.cumsum(deficit)
    starts = ends - deficit
    excess = np.cumsum(q[heavy] - 1.0)
    donor = np.minimum(np.searchsorted(excess, starts, side="right"), heavy.size - 1)
    prob[light], alias[light] = q[light], heavy[donor]
    served = np.searchsorted(starts, excess, side="left")  # lights served by heavies <= j
    given = np.where(served > 0, ends[np.maximum(served - 1, 0)], 0.0)
    prob[heavy[:-1]] = np.clip(1.0 + excess[:-1] - given[:-1], 0.0, 1.0)
    alias[heavy[:-1]] = heavy[1:]  # the last heavy keeps its whole column
    return prob, alias


@dataclass
class TableKeys:
    """One table's keys to draw from, and the vectors of its verified keys."""

    spec: TableSpec
    keys: np.ndarray  # int64, Zipf rank order
    prob: np.ndarray  # the alias table of the keys' Zipf probabilities (alias_table)
    alias: np.ndarray
    verify_keys: np.ndarray
    verify_vectors: np.ndarray  # [len(verify_keys), dim] float32
    bulk_keys: np.ndarray
    fresh_keys: np.ndarray


@dataclass(frozen=True)
class KeyDraws:
    """Zipf draws for several tables at once: their alias tables back to back, so a request's
    keys for every table are one handful of NumPy operations, O(1) per key."""

    keys: np.ndarray
    prob: np.ndarray
    alias: np.ndarray  # indices into ``keys``
    starts: np.ndarray  # where each table begins
    sizes: np.ndarray  # its number of keys (float64)

    @classmethod
    def of(cls, tables: list[TableKeys]) -> KeyDraws:
        sizes = np.array([t.keys.size for t in tables], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return cls(
            np.concatenate([t.keys for t in tables]),
            np.concatenate([t.prob for t in tables]),
            np.concatenate([t.alias + s for t, s in zip(tables, starts, strict=True)]),
            starts,
            sizes.astype(np.float64),
        )

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` keys of each table, drawn independently: int64 ``[tables, n]``."""
        x = rng.random((self.starts.size, n)) * self.sizes[:, None]
        column = x.astype(np.int64)  # uniform over the table's columns ...
        i = column + self.starts[:, None]
        kept = (x - column) < self.prob[i]  # ... and the fraction left decides: it or its alias
        return self.keys[np.where(kept, i, self.alias[i])]


def _split(
    spec: TableSpec, keys: np.ndarray, exponent: float, rng: np.random.Generator
) -> tuple[TableKeys, np.ndarray]:
    """The table's keys by class, with ``VERIFY_POOL`` known keys picked (and where in
    ``keys`` they are); their vectors are the caller's to fill in."""
    if keys.size == 0:
        raise ConfigError(f"{spec.name}: the table holds no keys to load-test with")
    cls = key_class(keys)
    verifiable = np.flatnonzero(cls > FRESH)
    pick = np.sort(rng.choice(verifiable, min(VERIFY_POOL, verifiable.size), replace=False))
    no_vectors = np.zeros((0, spec.dim), dtype=np.float32)
    prob, alias = alias_table(zipf_probabilities(keys.size, exponent))
    table = TableKeys(
        spec, keys, prob, alias, keys[pick], no_vectors, keys[cls == BULK], keys[cls == FRESH]
    )
    return table, pick


def served(spec: TableSpec, vectors: np.ndarray) -> np.ndarray:
    """What serving answers for float32 ``vectors`` written to ``spec``: the vectors as its
    row format stores them, decoded (the vectors themselves for a float32 table)."""
    return spec.fmt.decode(spec.fmt.encode(vectors), spec.dim)


def from_sparse(spec: TableSpec, path: str, exponent: float, rng: np.random.Generator) -> TableKeys:
    """A table's keys from its sparse-model files (a random ``MAX_KEYS`` of larger ones)."""
    from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, sparse_model_rows

    rows = sparse_model_rows(path, spec.dim)
    all_keys = np.memmap(Path(path) / KEY_FILE, dtype="<i8", mode="r", shape=(rows,))
    vectors = np.memmap(Path(path) / VECTOR_FILE, dtype="<f4", mode="r", shape=(rows, spec.dim))
    index = np.arange(rows) if rows <= MAX_KEYS else np.sort(rng.choice(rows, MAX_KEYS, False))
    table, pick = _split(spec, np.asarray(all_keys[index], dtype=np.int64), exponent, rng)
    known = np.asarray(vectors[index[pick]], dtype=np.float32)
    return replace(table, verify_vectors=served(spec, known))


def from_l3(spec: TableSpec, tiers: Tiers, exponent: float, rng: np.random.Generator) -> TableKeys:
    """A table's keys from L3 (its first ``MAX_KEYS``), the known vectors read back."""
    chunks, total = [], 0
    for keys, _ in tiers.dump(spec.name):
        chunks.append(np.asarray(keys, dtype=np.int64))
        total += keys.size
        if total >= MAX_KEYS:
            break
    keys = np.concatenate(chunks)[:MAX_KEYS] if chunks else np.zeros(0, np.int64)
    table, _ = _split(spec, keys, exponent, rng)
    got = tiers.fetch(spec, table.verify_keys)
    found = got.found
    vectors = spec.fmt.decode(got.values[found], spec.dim)  # stored rows, as served
    return replace(table, verify_keys=table.verify_keys[found], verify_vectors=vectors)

"""What the load-test users send, and how their answers are checked (no Locust in here).

Keys come from the real keys of the ps.json's tables (the sparse files, else L3), drawn by a
Zipf law over the keys in file order (rank 1 is the first key; exponent ``zipf``; 0 is
uniform). A request carries ``samples`` samples x ``keys_per_sample`` keys for every table
(HugeCTR's limit is ``max_batch_size`` x ``maxnum_catfeature_query_per_table_per_sample``).

Every key falls in one of three classes by a hash of the key (:func:`key_class`): ``BULK``
keys receive the publisher's bulk updates, ``FRESH`` keys the freshness probes, and all the
others are never updated, so their vectors are known: each lookup request carries
``verify_per_table`` of them per table at random positions, and an answer whose vectors
differ there is a wrong answer (a failure, not just an error status).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError
from hps.types import TableSpec

if TYPE_CHECKING:
    from hps.ctr.network import DenseNetwork

CLASSES = 16
BULK, FRESH = 0, 1  # key classes that updates touch; every other class is verified
VERIFY_POOL = 4096  # known vectors kept per table
MAX_KEYS = 1 << 20  # keys per table drawn from (a random subset of larger tables)


class WrongAnswer(AssertionError):
    """Triton answered, but not what the tables hold."""


def key_class(keys: np.ndarray) -> np.ndarray:
    """``0 .. CLASSES - 1`` per key (splitmix64 of the key), the same in every process."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(CLASSES)).astype(np.int64)


def zipf_cdf(n: int, exponent: float) -> np.ndarray:
    """Cumulative probabilities of ranks ``1..n`` under Zipf(``exponent``), any exponent >= 0."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -float(exponent)
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


@dataclass
class TableKeys:
    """One table's keys to draw from, and the vectors of its verified keys."""

    spec: TableSpec
    keys: np.ndarray  # int64, Zipf rank order
    cdf: np.ndarray
    verify_keys: np.ndarray
    verify_vectors: np.ndarray  # [len(verify_keys), dim] float32
    bulk_keys: np.ndarray
    fresh_keys: np.ndarray

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        idx = np.searchsorted(self.cdf, rng.random(n), side="right")
        return self.keys[np.minimum(idx, self.keys.size - 1)]


def _split(spec: TableSpec, keys: np.ndarray, exponent: float, rng: np.random.Generator) -> dict:
    if keys.size == 0:
        raise ConfigError(f"{spec.name}: the table holds no keys to load-test with")
    cls = key_class(keys)
    verifiable = np.flatnonzero(cls > FRESH)
    pick = np.sort(rng.choice(verifiable, min(VERIFY_POOL, verifiable.size), replace=False))
    return {
        "spec": spec,
        "keys": keys,
        "cdf": zipf_cdf(keys.size, exponent),
        "verify_index": pick,
        "bulk_keys": keys[cls == BULK],
        "fresh_keys": keys[cls == FRESH],
    }


def _from_sparse(
    spec: TableSpec, path: str, exponent: float, rng: np.random.Generator
) -> TableKeys:
    from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, sparse_model_rows

    rows = sparse_model_rows(path, spec.dim)
    all_keys = np.memmap(Path(path) / KEY_FILE, dtype="<i8", mode="r", shape=(rows,))
    vectors = np.memmap(Path(path) / VECTOR_FILE, dtype="<f4", mode="r", shape=(rows, spec.dim))
    index = np.arange(rows) if rows <= MAX_KEYS else np.sort(rng.choice(rows, MAX_KEYS, False))
    parts = _split(spec, np.asarray(all_keys[index], dtype=np.int64), exponent, rng)
    vi = parts.pop("verify_index")
    return TableKeys(
        verify_keys=parts["keys"][vi],
        verify_vectors=np.asarray(vectors[index[vi]], dtype=np.float32),
        **parts,
    )


def _from_l3(
    spec: TableSpec, store: object, exponent: float, rng: np.random.Generator
) -> TableKeys:
    chunks, total = [], 0
    for keys, _ in store.dump(spec.name):  # type: ignore[attr-defined]
        chunks.append(np.asarray(keys, dtype=np.int64))
        total += keys.size
        if total >= MAX_KEYS:
            break
    keys = np.concatenate(chunks)[:MAX_KEYS] if chunks else np.zeros(0, np.int64)
    parts = _split(spec, keys, exponent, rng)
    vkeys = keys[parts.pop("verify_index")]
    vectors, found = store.fetch(spec.name, vkeys)  # type: ignore[attr-defined]
    return TableKeys(verify_keys=vkeys[found], verify_vectors=np.asarray(vectors)[found], **parts)


@dataclass
class Workload:
    """Requests for one ps.json model, built from its tables' real keys."""

    model: ModelConfig
    tables: list[TableKeys]
    samples: tuple[int, int]  # inclusive range of samples per request
    keys_per_sample: int = 1
    verify_per_table: int = 4
    num_dense: int = 0
    network: DenseNetwork | None = field(default=None, repr=False)  # CTR scores to expect

    @property
    def name(self) -> str:
        return self.model.model

    @property
    def dims(self) -> list[int]:
        return [t.spec.dim for t in self.tables]

    def batch(self, rng: np.random.Generator) -> int:
        lo, hi = self.samples
        return int(rng.integers(lo, hi + 1))

    # -- HugeCTR's HPS interface: KEYS + NUMKEYS -> OUTPUT0 ---------------------------------

    def lookup_request(self, rng: np.random.Generator) -> LookupRequest:
        """One HPS request with known keys planted at random positions of every table."""
        n = self.batch(rng) * self.keys_per_sample
        parts, checks = [], []
        for t in self.tables:
            keys = t.draw(n, rng)
            m = min(self.verify_per_table, n, t.verify_keys.size)
            pos = rng.choice(n, m, replace=False)
            which = rng.integers(0, t.verify_keys.size, m)
            keys[pos] = t.verify_keys[which]
            parts.append(keys)
            checks.append((pos, t.verify_vectors[which]))
        numkeys = np.full(len(self.tables), n, dtype=np.int32)
        return LookupRequest(np.concatenate(parts), numkeys, self.dims, checks)

    def probe_request(self, table: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """KEYS and NUMKEYS asking for ``keys`` of one table only."""
        numkeys = np.zeros(len(self.tables), dtype=np.int32)
        numkeys[table] = keys.size
        return keys.astype(np.int64), numkeys

    # -- the example CTR model: DES + CATCOLUMN + ROWINDEX -> scores ------------------------

    def ctr_request(self, rng: np.random.Generator, known: int = 4) -> CTRRequest:
        """A CTR request whose first ``known`` samples use verified keys only."""
        batch, k = self.batch(rng), self.keys_per_sample
        known = min(known, batch)
        cols, pooled = [], []
        for t in self.tables:
            keys = t.draw(batch * k, rng).reshape(batch, k)
            which = rng.integers(0, t.verify_keys.size, (known, k))
            keys[:known] = t.verify_keys[which]
            cols.append(keys.reshape(-1))
            pooled.append(t.verify_vectors[which].sum(axis=1))
        rowindex = np.tile(np.arange(batch + 1, dtype=np.int32) * k, len(self.tables))
        dense = rng.standard_normal(batch * self.num_dense).astype(np.float32)
        expected = None
        if self.network is not None and known:
            d = dense.reshape(batch, self.num_dense)[:known]
            expected = self.network(d, np.concatenate(pooled, axis=1))
        return CTRRequest(dense, np.concatenate(cols), rowindex, known, expected)

    # -- requests that must be refused with a client error ---------------------------------

    def bad_requests(self) -> list[tuple[str, dict[str, np.ndarray]]]:
        """(what is wrong, inputs): each must get INVALID_ARG / HTTP 400, nothing else."""
        t0 = self.tables[0]
        n = len(self.tables)
        limit = t0.spec.max_keys_per_request or self.model.max_batch_size
        counts = np.zeros(n, dtype=np.int32)
        counts[0] = limit + 1
        two = np.array([t0.keys[0], t0.keys[-1]], dtype=np.int64)
        return [
            ("counts exceed keys", {"KEYS": two[None], "NUMKEYS": np.full((1, n), 2, np.int32)}),
            ("negative count", {"KEYS": two[None], "NUMKEYS": _counts(n, 0, -1, 3)}),
            (
                "too many keys",
                {
                    "KEYS": t0.draw(limit + 1, np.random.default_rng())[None],
                    "NUMKEYS": counts[None],
                },
            ),  # fmt: skip
            ("wrong dtype", {"KEYS": two.astype(np.int32)[None], "NUMKEYS": _counts(n, 0, 2)}),
        ]


def _counts(n: int, index: int, value: int, other: int | None = None) -> np.ndarray:
    counts = np.zeros((1, n), dtype=np.int32)
    counts[0, index] = value
    if other is not None and n > 1:
        counts[0, 1] = other
    elif other is not None:
        counts[0, 0] = value
    return counts


@dataclass
class LookupRequest:
    keys: np.ndarray
    numkeys: np.ndarray
    dims: list[int]
    checks: list[tuple[np.ndarray, np.ndarray]]  # per table: (positions, expected vectors)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {"KEYS": self.keys[None], "NUMKEYS": self.numkeys[None]}

    def check(self, output: np.ndarray) -> None:
        """Raise :class:`WrongAnswer` unless every planted key got its vector."""
        flat = np.asarray(output, dtype=np.float32).reshape(-1)
        expected_size = int(np.dot(self.numkeys, self.dims))
        if flat.size != expected_size:
            raise WrongAnswer(f"OUTPUT0 has {flat.size} values, expected {expected_size}")
        start = 0
        for t, (n, dim) in enumerate(zip(self.numkeys.tolist(), self.dims, strict=True)):
            rows = flat[start : start + n * dim].reshape(n, dim)
            pos, want = self.checks[t]
            bad = ~np.isclose(rows[pos], want, rtol=1e-5, atol=1e-6).all(axis=1)
            if bad.any():
                raise WrongAnswer(
                    f"table {t}: {int(bad.sum())}/{pos.size} known keys got wrong vectors"
                )
            start += n * dim


@dataclass
class CTRRequest:
    dense: np.ndarray
    catcolumn: np.ndarray
    rowindex: np.ndarray
    known: int
    expected: np.ndarray | None  # scores of the first ``known`` samples

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {"DES": self.dense[None], "CATCOLUMN": self.catcolumn[None],
                "ROWINDEX": self.rowindex[None]}  # fmt: skip

    def check(self, output: np.ndarray) -> None:
        """Raise :class:`WrongAnswer` unless the scores are probabilities, and the known
        samples' scores are what the tables and the dense weights give."""
        scores = np.asarray(output, dtype=np.float32).reshape(-1)
        if not np.isfinite(scores).all() or ((scores < 0) | (scores > 1)).any():
            raise WrongAnswer("CTR scores are not probabilities")
        if self.expected is not None:
            got = scores[: self.known]
            if not np.allclose(got, self.expected, rtol=1e-3, atol=1e-5):
                raise WrongAnswer(f"CTR scores {got.tolist()} != expected {self.expected.tolist()}")


def load_workload(
    config: PSConfig,
    model: str | None = None,
    *,
    zipf: float = 1.1,
    samples: tuple[int, int] | None = None,
    keys_per_sample: int = 1,
    verify_per_table: int = 4,
    seed: int = 0,
) -> Workload:
    """Read the keys of a model's tables (sparse files first, else L3, opened read-only)."""
    mc = config.model(model) if model else config.models[0]
    rng = np.random.default_rng(seed)
    specs = mc.tables
    limit = min((s.max_keys_per_request or 1 << 30) for s in specs) // max(1, keys_per_sample)
    lo, hi = samples or (mc.max_batch_size, mc.max_batch_size)
    if not 1 <= lo <= hi or hi > max(1, limit):
        raise ConfigError(
            f"--samples {lo}-{hi} x {keys_per_sample} keys exceed {mc.model}'s limit of "
            f"{limit} samples (max_batch_size x maxnum_catfeature_query_per_table_per_sample)"
        )
    have_sparse = bool(mc.sparse_files) and all(os.path.isdir(p) for p in mc.sparse_files)
    tables: list[TableKeys] = []
    if have_sparse:
        tables = [
            _from_sparse(s, p, zipf, rng) for s, p in zip(specs, mc.sparse_files, strict=True)
        ]
    elif config.persistent_db.type != "disabled" and os.path.isdir(config.persistent_db.path):
        from hps.tiers import Tiers

        tiers = Tiers.open(config, l3_mode="read_only", l2=False)
        try:
            tiers.open_tables(specs)
            tables = [_from_l3(s, tiers.persistent, zipf, rng) for s in specs]
        finally:
            tiers.close()
    else:
        raise ConfigError(
            f"{mc.model}: no sparse_files and no local L3 to read the tables' keys from"
        )
    network = None
    if mc.dense_file.endswith(".npz") and os.path.exists(mc.dense_file):
        from hps.ctr.network import DenseNetwork

        network = DenseNetwork(mc.dense_file, "numpy")
    num_dense = network.num_dense if network else mc.maxnum_des_feature_per_sample
    return Workload(mc, tables, (lo, hi), keys_per_sample, verify_per_table, num_dense, network)

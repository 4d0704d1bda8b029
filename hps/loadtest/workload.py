"""What the load-test users send: a ps.json model's requests, built from its tables' keys
(no Locust in here).

A request carries ``samples`` samples x ``keys_per_sample`` keys for every table (HugeCTR's
limit is ``max_batch_size`` x ``maxnum_catfeature_query_per_table_per_sample``), and
``verify_per_table`` known keys per table at random positions (:mod:`hps.loadtest.keys`
chooses them; :mod:`hps.loadtest.requests` checks the answers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError
from hps.loadtest.keys import KeyDraws, TableKeys, from_l3, from_sparse
from hps.loadtest.requests import CTRRequest, LookupRequest

if TYPE_CHECKING:
    from hps.ctr.network import DenseNetwork


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

    @cached_property
    def draws(self) -> KeyDraws:
        """The tables' Zipf draws, together (:class:`hps.loadtest.keys.KeyDraws`)."""
        return KeyDraws.of(self.tables)

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
        keys = self.draws.draw(n, rng)
        checks = []
        for t, row in zip(self.tables, keys, strict=True):
            m = min(self.verify_per_table, n, t.verify_keys.size)
            pos = rng.choice(n, m, replace=False)
            which = rng.integers(0, t.verify_keys.size, m)
            row[pos] = t.verify_keys[which]
            checks.append((pos, t.verify_vectors[which]))
        numkeys = np.full(len(self.tables), n, dtype=np.int32)
        return LookupRequest(keys.reshape(-1), numkeys, self.dims, checks)

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
        cols = self.draws.draw(batch * k, rng)
        pooled = []
        for t, col in zip(self.tables, cols, strict=True):
            keys = col.reshape(batch, k)
            which = rng.integers(0, t.verify_keys.size, (known, k))
            keys[:known] = t.verify_keys[which]
            pooled.append(t.verify_vectors[which].sum(axis=1))
        rowindex = np.tile(np.arange(batch + 1, dtype=np.int32) * k, len(self.tables))
        dense = rng.standard_normal(batch * self.num_dense).astype(np.float32)
        expected = None
        if self.network is not None and known:
            d = dense.reshape(batch, self.num_dense)[:known]
            expected = self.network(d, np.concatenate(pooled, axis=1))
        return CTRRequest(dense, cols.reshape(-1), rowindex, known, expected)

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
                    "KEYS": self.draws.draw(limit + 1, np.random.default_rng())[:1],
                    "NUMKEYS": counts[None],
                },
            ),  # fmt: skip
            (
                "wrong dtype",
                {"KEYS": two.astype(np.int32)[None], "NUMKEYS": _counts(n, 0, 2)},
            ),
        ]


def _counts(n: int, index: int, value: int, other: int | None = None) -> np.ndarray:
    counts = np.zeros((1, n), dtype=np.int32)
    counts[0, index] = value
    if other is not None and n > 1:
        counts[0, 1] = other
    elif other is not None:
        counts[0, 0] = value
    return counts


def check_samples(
    mc: ModelConfig, samples: tuple[int, int] | None, keys_per_sample: int
) -> tuple[int, int]:
    """The samples per request (``samples``, else the model's max_batch_size); ConfigError
    when that many samples of ``keys_per_sample`` keys exceed a table's keys per request."""
    if keys_per_sample < 1:
        raise ConfigError(f"--keys-per-sample {keys_per_sample}: must be 1 or more")
    limit = min((s.max_keys_per_request or 1 << 30) for s in mc.tables) // keys_per_sample
    lo, hi = samples or (mc.max_batch_size, mc.max_batch_size)
    if not 1 <= lo <= hi or hi > limit:
        raise ConfigError(
            f"--samples {lo}-{hi} x {keys_per_sample} keys exceed {mc.model}'s limit of "
            f"{limit} samples (max_batch_size x maxnum_catfeature_query_per_table_per_sample)"
        )
    return lo, hi


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
    """Read the keys of a model's tables (sparse files first, else L3, opened read-only), as
    its live version has them (its files, dims and dense network): what an unversioned
    request is answered with."""
    from hps.versions import VersionRegistry

    registry = VersionRegistry(config)
    name = model or config.models[0].model
    mc = registry.model_at(name, registry.live(name))
    rng = np.random.default_rng(seed)
    specs = mc.tables
    lo, hi = check_samples(mc, samples, keys_per_sample)
    have_sparse = bool(mc.sparse_files) and all(os.path.isdir(p) for p in mc.sparse_files)
    tables: list[TableKeys] = []
    if have_sparse:
        tables = [from_sparse(s, p, zipf, rng) for s, p in zip(specs, mc.sparse_files, strict=True)]
    elif config.persistent_db.type != "disabled" and os.path.isdir(config.persistent_db.path):
        from hps.tiers import Tiers

        tiers = Tiers.open(config, l3_mode="read_only", l2=False)
        try:
            tiers.open_tables(specs)
            tables = [from_l3(s, tiers, zipf, rng) for s in specs]
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

"""The load-test workload: requests of real keys with known ones planted, answer checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import load_config
from hps.ctr.demo import table_sizes
from hps.ctr.network import pool_embeddings
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model
from hps.loadtest.keys import FRESH, key_class
from hps.loadtest.requests import WrongAnswer
from hps.loadtest.workload import load_workload
from hps.versions import VersionRegistry
from tests.unit.loadtest.conftest import vectors_of


def test_requests_use_real_keys_and_plant_known_ones(demo: Path) -> None:
    config = load_config(demo)
    w = load_workload(config, zipf=1.2, samples=(32, 32), verify_per_table=5)
    rng = np.random.default_rng(1)
    req = w.lookup_request(rng)
    assert req.numkeys.tolist() == [32, 32, 32]
    sizes = table_sizes(3, 3000)
    parts = np.split(req.keys, np.cumsum(req.numkeys)[:-1])
    for part, rows, (pos, want), t in zip(parts, sizes, req.checks, w.tables, strict=True):
        assert part.min() >= 0 and part.max() < rows  # the demo's keys are 0 .. rows-1
        assert pos.size == 5 and np.all(key_class(part[pos]) > FRESH)
        i = w.tables.index(t)
        assert np.array_equal(want, vectors_of(i, part[pos]))
    # A correct answer passes, one wrong vector fails.
    vecs = [vectors_of(i, p) for i, p in enumerate(parts)]
    good = np.concatenate([v.ravel() for v in vecs])
    req.check(good)
    pos0 = req.checks[1][0][0]
    bad = good.copy()
    bad[32 * 4 + pos0 * 4] += 1.0
    with pytest.raises(WrongAnswer, match="table 1"):
        req.check(bad)
    with pytest.raises(WrongAnswer, match="values"):
        req.check(good[:-1])


def test_ctr_request_expects_the_networks_scores(demo: Path) -> None:
    w = load_workload(load_config(demo), samples=(16, 16), keys_per_sample=2)
    req = w.ctr_request(np.random.default_rng(2), known=3)
    assert req.rowindex.size == 3 * 17 and req.catcolumn.size == 3 * 32
    assert req.expected is not None and req.expected.shape == (3,)
    # Score every sample as the CTR model would, from the demo's reproducible vectors.
    keys = np.split(req.catcolumn, 3)
    vectors = np.concatenate([vectors_of(i, k).ravel() for i, k in enumerate(keys)])
    offsets = req.rowindex.reshape(3, 17).astype(np.int64)
    pooled = pool_embeddings(vectors, np.array([32, 32, 32]), offsets, [4, 4, 4])
    assert w.network is not None
    scores = w.network(req.dense.reshape(16, w.num_dense), pooled)
    req.check(scores)
    with pytest.raises(WrongAnswer):
        req.check(np.concatenate([[scores[0] * 0.5 + 0.1], scores[1:]]))


def test_limits_are_checked(demo: Path) -> None:
    config = load_config(demo)  # max_batch_size 1024 x 4 keys per table per sample
    with pytest.raises(ConfigError, match="limit of 1024 samples"):
        load_workload(config, samples=(10, 1025), keys_per_sample=4)
    names = [name for name, _ in load_workload(config, samples=(8, 8)).bad_requests()]
    assert names == ["counts exceed keys", "negative count", "too many keys", "wrong dtype"]


def test_the_live_versions_tables_are_load_tested(demo: Path, tmp_path: Path) -> None:
    """With version 2 live (files of its own), the known keys are checked against version
    2's vectors, read from its files, in its namespace."""
    config = load_config(demo)
    entry = config.models[0]
    files = []
    for i, rows in enumerate(table_sizes(3, 3000)):
        keys = np.arange(rows, dtype=np.int64)
        write_sparse_model(tmp_path / f"v2_{i}", keys, vectors_of(i, keys) + 10.0)
        files.append(str(tmp_path / f"v2_{i}"))
    local = config.model_copy(  # a state folder of its own: the module's demo stays unversioned
        update={
            "persistent_db": config.persistent_db.model_copy(update={"path": str(tmp_path / "l3")})
        }
    )
    registry = VersionRegistry(local)
    registry.begin(entry.model_copy(update={"sparse_files": files}), 2)
    registry.set_state(entry.model, 2, "ready")
    registry.set_live(entry.model, 2)
    w = load_workload(local, samples=(8, 8))
    assert [t.spec.name for t in w.tables] == [s.name for s in entry.at_version(2).tables]
    for i, t in enumerate(w.tables):
        assert np.array_equal(t.verify_vectors, vectors_of(i, t.verify_keys) + 10.0)

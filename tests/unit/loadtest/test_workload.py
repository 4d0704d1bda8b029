"""The load-test workload: real keys, Zipf draws, planted known keys, answer checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import load_config
from hps.ctr.demo import create_demo, table_sizes, table_vectors
from hps.ctr.network import pool_embeddings
from hps.errors import ConfigError
from hps.loadtest.workload import (
    BULK,
    FRESH,
    WrongAnswer,
    key_class,
    load_workload,
    zipf_cdf,
)


def vectors_of(table: int, keys: np.ndarray, dim: int = 4) -> np.ndarray:
    """The demo's vectors of ``keys`` (table ``table`` holds keys 0 .. rows - 1 in order)."""
    rows = table_sizes(3, 3000)[table]
    return table_vectors(np.arange(rows, dtype=np.int64), dim, table)[keys]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_demo(tmp_path_factory.mktemp("demo"), num_tables=3, max_rows=3000, dim=4)


def test_key_classes_are_stable_and_spread() -> None:
    keys = np.arange(-50_000, 50_000, dtype=np.int64)
    cls = key_class(keys)
    assert np.array_equal(cls, key_class(keys.copy()))
    share = np.bincount(cls) / keys.size
    assert share.size == 16 and np.all(np.abs(share - 1 / 16) < 0.01)


def test_zipf_cdf_is_skewed_by_the_exponent() -> None:
    flat, steep = zipf_cdf(1000, 0.0), zipf_cdf(1000, 1.2)
    assert flat[0] == pytest.approx(0.001)
    assert steep[0] > 0.15 and steep[-1] == pytest.approx(1.0)


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


def test_bulk_and_fresh_keys_are_never_verified(demo: Path) -> None:
    w = load_workload(load_config(demo), samples=(8, 8))
    for t in w.tables:
        assert np.all(key_class(t.bulk_keys) == BULK)
        assert np.all(key_class(t.fresh_keys) == FRESH)
        assert not np.isin(t.verify_keys, np.concatenate([t.bulk_keys, t.fresh_keys])).any()


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


def test_keys_come_from_l3_without_sparse_files(tmp_path: Path, demo: Path) -> None:
    import json

    from hps.triton.serving import prepare_tables, serving_config

    prepare_tables(serving_config(demo))
    doc = json.loads(demo.read_text())
    doc["models"][0]["sparse_files"] = []
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    w = load_workload(load_config(tmp_path / "ps.json"), samples=(8, 8))
    t = w.tables[2]
    assert t.keys.size == 1000
    assert np.array_equal(t.verify_vectors, vectors_of(2, t.verify_keys))


def test_limits_are_checked(demo: Path) -> None:
    config = load_config(demo)  # max_batch_size 1024 x 4 keys per table per sample
    with pytest.raises(ConfigError, match="limit of 1024 samples"):
        load_workload(config, samples=(10, 1025), keys_per_sample=4)
    names = [name for name, _ in load_workload(config, samples=(8, 8)).bad_requests()]
    assert names == ["counts exceed keys", "negative count", "too many keys", "wrong dtype"]

"""The load-test keys: classes by hash, Zipf draws, known keys never updated, keys from L3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import load_config
from hps.loadtest.keys import (
    BULK,
    FRESH,
    KeyDraws,
    TableKeys,
    alias_table,
    key_class,
    zipf_probabilities,
)
from hps.loadtest.workload import load_workload
from hps.types import TableSpec
from tests.unit.loadtest.conftest import vectors_of


def test_key_classes_are_stable_and_spread() -> None:
    keys = np.arange(-50_000, 50_000, dtype=np.int64)
    cls = key_class(keys)
    assert np.array_equal(cls, key_class(keys.copy()))
    share = np.bincount(cls) / keys.size
    assert share.size == 16 and np.all(np.abs(share - 1 / 16) < 0.01)


def test_zipf_probabilities_are_skewed_by_the_exponent() -> None:
    flat, steep = zipf_probabilities(1000, 0.0), zipf_probabilities(1000, 1.2)
    assert flat[0] == pytest.approx(0.001) and flat.sum() == pytest.approx(1.0)
    assert steep[0] > 0.15 and steep.sum() == pytest.approx(1.0)
    assert (np.diff(steep) < 0).all()


def _implied(prob: np.ndarray, alias: np.ndarray) -> np.ndarray:
    """What an alias table draws each index with: its own column's share plus the others'."""
    return (prob + np.bincount(alias, weights=1 - prob, minlength=prob.size)) / prob.size


@pytest.mark.parametrize(
    ("n", "exponent"), [(1, 1.0), (2, 1.0), (7, 3.0), (1000, 0.0), (1000, 1.2), (100_000, 1.1)]
)
def test_the_alias_table_draws_each_rank_with_its_probability(n: int, exponent: float) -> None:
    p = zipf_probabilities(n, exponent)
    prob, alias = alias_table(p)
    assert ((prob >= 0) & (prob <= 1)).all() and ((alias >= 0) & (alias < n)).all()
    np.testing.assert_allclose(_implied(prob, alias), p, rtol=1e-9, atol=0)


def test_the_alias_table_takes_any_weights() -> None:
    p = np.random.default_rng(0).random(10_000) ** 3
    p /= p.sum()
    np.testing.assert_allclose(_implied(*alias_table(p)), p, rtol=1e-9, atol=0)


def test_key_draws_follow_each_tables_law() -> None:
    tables, laws = [], []
    for size, exponent in [(50, 1.2), (3, 0.0)]:
        spec = TableSpec("m", f"t{size}", 4)
        keys = np.arange(size, dtype=np.int64) + 1000 * size  # distinct per table
        laws.append(zipf_probabilities(size, exponent))
        none = np.zeros(0, np.int64)
        vectors = np.zeros((0, 4), np.float32)
        tables.append(TableKeys(spec, keys, *alias_table(laws[-1]), none, vectors, none, none))
    got = KeyDraws.of(tables).draw(200_000, np.random.default_rng(1))
    assert got.shape == (2, 200_000)
    for row, t, p in zip(got, tables, laws, strict=True):
        counts = np.bincount(row - t.keys[0], minlength=t.keys.size)
        assert counts.size == t.keys.size  # only the table's own keys
        sigma = np.sqrt(200_000 * p * (1 - p))
        assert (np.abs(counts - 200_000 * p) < 5 * sigma).all()


def test_bulk_and_fresh_keys_are_never_verified(demo: Path) -> None:
    w = load_workload(load_config(demo), samples=(8, 8))
    for t in w.tables:
        assert np.all(key_class(t.bulk_keys) == BULK)
        assert np.all(key_class(t.fresh_keys) == FRESH)
        assert not np.isin(t.verify_keys, np.concatenate([t.bulk_keys, t.fresh_keys])).any()


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

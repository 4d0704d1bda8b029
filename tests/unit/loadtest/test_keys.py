"""The load-test keys: classes by hash, Zipf draws, known keys never updated, keys from L3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import load_config
from hps.loadtest.keys import BULK, FRESH, key_class, zipf_cdf
from hps.loadtest.workload import load_workload
from tests.unit.loadtest.conftest import vectors_of


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

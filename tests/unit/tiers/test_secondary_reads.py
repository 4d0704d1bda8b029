"""A read that falls through to a secondary L3 sees the writer's rows of at most
SECONDARY_LAG_S ago: the tiers catch it up first, at most that often."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.tiers import tiers as tiers_module
from hps.types import TableSpec

SPEC = TableSpec("m", "t", 4)
KEYS = np.arange(6, dtype=np.int64)


def _rows(value: float) -> np.ndarray:
    return np.full((KEYS.size, SPEC.dim), value, np.float32)


@pytest.fixture
def writer(tmp_path: Path) -> RocksDBStore:
    store = RocksDBStore(str(tmp_path / "db"))
    store.open_table(SPEC)
    store.insert(SPEC.name, KEYS, _rows(0.0))
    return store


def _reader(writer: RocksDBStore) -> tuple[Tiers, RocksDBStore]:
    store = RocksDBStore(writer.path, mode="secondary")
    store.open_table(SPEC)
    return Tiers(None, store), store


def test_a_read_catches_a_stale_secondary_up(
    writer: RocksDBStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiers_module, "SECONDARY_LAG_S", 0.0)
    tiers, store = _reader(writer)
    assert (tiers.fetch(SPEC, KEYS).values == 0.0).all()
    writer.insert(SPEC.name, KEYS[:3], _rows(1.0)[:3])  # an update; L2 no longer holds it
    got = tiers.fetch(SPEC, KEYS)
    assert got.found.all()
    np.testing.assert_array_equal(got.values[:, 0], [1, 1, 1, 0, 0, 0])
    store.close()
    writer.close()


def test_catch_ups_for_reads_are_rate_limited(
    writer: RocksDBStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiers_module, "SECONDARY_LAG_S", 3600.0)
    tiers, store = _reader(writer)
    tiers.fetch(SPEC, KEYS)  # the first read catches up: none had yet
    writer.insert(SPEC.name, KEYS[:3], _rows(1.0)[:3])
    got = tiers.fetch(SPEC, KEYS)  # within the bound: no catch-up, the older rows
    assert store.catch_ups == 1 and (got.values == 0.0).all()
    tiers.catch_up()  # an explicit one is never skipped
    assert store.catch_ups == 2
    np.testing.assert_array_equal(tiers.fetch(SPEC, KEYS).values[:3, 0], [1, 1, 1])
    store.close()
    writer.close()

"""``hps import --force`` repairs a damaged RocksDB table (docs/storage.md): its damaged files
go, in the same row format or another, and ``hps verify`` then finds it intact.

Real RocksDB files, damaged by flipping bytes in an SST data block after a flush and a
compaction (tests/integration/storage/damage.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rocksdict as rd

from hps.config import PSConfig
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import ImportRecord, import_tables
from hps.storage.rocks_db import RocksDBStore
from hps.topology import topology
from hps.types import TableSpec
from tests.helpers import make_config
from tests.integration.storage.damage import damage

pytestmark = pytest.mark.integration

ROWS = 20_000
DIM = 16
SPEC = TableSpec("demo", "t0", DIM)
KEYS = np.arange(ROWS, dtype=np.int64)
VECTORS = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)


def config_of(tmp_path: Path, dtype: str) -> PSConfig:
    write_sparse_model(tmp_path / "t0.model", KEYS, VECTORS)
    model = {
        "model": "demo",
        "embedding_table_names": ["t0"],
        "embedding_vecsize_per_table": [DIM],
        "sparse_files": [str(tmp_path / "t0.model")],
        "gpucache": False,
        "hps_row_dtype": dtype,
    }
    return make_config(tmp_path, models=[model])


def compact(path: Path) -> None:
    """Flush and compact every column family into SST files."""
    opts = rd.Options(raw_mode=True)
    cfs = {cf: rd.Options(raw_mode=True) for cf in rd.Rdict.list_cf(str(path), opts)}
    db = rd.Rdict(str(path), opts, column_families=cfs)
    try:
        db.flush()
        cf = db.get_column_family(SPEC.name)
        cf.flush()
        cf.compact_range(None, None)
    finally:
        db.close()


def check(config: PSConfig, expected: np.ndarray) -> str | None:
    """The table's verify outcome; its rows read back are ``expected``."""
    spec = config.tables[0]
    store = RocksDBStore(config.persistent_db.path, mode="read_only")
    try:
        store.open_table(spec)
        _, why = store.verify(spec.name)
        if why is None:
            got, found = store.fetch(spec.name, KEYS)
            assert found.all()
            np.testing.assert_array_equal(got, expected)
        return why
    finally:
        store.close()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_forced_import_repairs_a_damaged_table(tmp_path: Path, dtype: str) -> None:
    config = config_of(tmp_path, "float32")
    path = Path(config.persistent_db.path)
    assert import_tables(config, topology(config)) == {SPEC.name: ROWS}
    compact(path)
    assert 0 < damage(path, SPEC, ROWS).size < ROWS
    assert check(config, VECTORS) is not None  # hps verify: DAMAGED

    again = config_of(tmp_path, dtype)
    assert import_tables(again, topology(again), force=True) == {SPEC.name: ROWS}
    assert check(again, VECTORS.astype(dtype)) is None  # intact, every row exact
    state = topology(again).state_dir
    assert state is not None and ImportRecord(state).digest(SPEC.name) is not None
    assert import_tables(again, topology(again)) == {}


def test_dropping_a_damaged_table_drops_its_files(tmp_path: Path) -> None:
    config = config_of(tmp_path, "float32")
    path = Path(config.persistent_db.path)
    import_tables(config, topology(config))
    compact(path)
    damage(path, SPEC, ROWS)
    store = RocksDBStore(str(path))
    try:
        store.open_table(SPEC)
        store.drop_table(SPEC.name)
        store.open_table(SPEC)
        assert store.verify(SPEC.name) == (0, None)
        assert store.size(SPEC.name) == 0
    finally:
        store.close()

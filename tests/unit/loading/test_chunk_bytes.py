"""An import streams a wide table in chunks of bounded bytes (hps.io.chunks), not of a fixed
number of rows (256k rows of dim 1024 were 1 GiB a chunk, held several times over)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.io import chunks
from hps.io.sparse_model import write_sparse_model
from hps.loading.loader import Loader, l3_holds, sparse_source
from hps.rowformat import RowDtype
from hps.storage.hash_map import HashMapStore
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.types import Keys, TableSpec
from tests.helpers import rows

DIM = 1024
BUDGET = 64 << 10  # 16 float32 rows of dim 1024


@pytest.mark.parametrize("row_dtype", ["float32", "int8"])
def test_a_wide_table_is_validated_loaded_and_compared_in_chunks_of_bounded_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row_dtype: RowDtype
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", BUDGET)
    keys = np.arange(100, dtype=np.int64)
    write_sparse_model(tmp_path / "t", keys, rows(keys, DIM))
    spec = TableSpec("m", "t", DIM, row_dtype=row_dtype)
    source = sparse_source(spec, tmp_path / "t")
    assert [k.size for k, _ in source.chunks()] == [16] * 6 + [4]
    assert source.validate() == 0

    l3, l2 = RocksDBStore(str(tmp_path / "db")), HashMapStore()
    tiers = Tiers(l2, l3)
    tiers.open_tables([spec])
    written: list[int] = []
    assert tiers.persistent is not None
    insert = tiers.persistent.insert

    def spy(table: str, k: Keys, values: np.ndarray, *, durable: bool = False) -> None:
        written.append(k.size)
        insert(table, k, values, durable=durable)

    monkeypatch.setattr(tiers.persistent, "insert", spy)
    assert Loader(tiers, "fill").load(source) == 100
    assert written == [16] * 6 + [4]
    assert l3_holds(tiers, source)
    got, found = l3.fetch(spec.name, keys)
    assert found.all() and np.array_equal(got, spec.fmt.encode(rows(keys, DIM)))
    tiers.close()

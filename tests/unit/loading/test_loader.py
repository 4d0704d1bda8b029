"""The loader and the import of a ps.json's tables: validation first, records, retrains."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.errors import ConfigError, FormatError, InvalidValueError, SparseModelError
from hps.io.sparse_model import SparseModelWriter, write_sparse_model
from hps.loading import loader
from hps.loading.imports import import_tables, sparse_sources
from hps.loading.loader import Loader, TableSource, l3_holds, npy_source, sparse_source
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.topology import topology
from tests.helpers import make_config, rows


def two_tables(tmp_path: Path, row_dtype: list[str] | None = None, **volatile: object) -> PSConfig:
    keys = np.arange(100, dtype=np.int64)
    paths = [tmp_path / "t0.model", tmp_path / "t1.model"]
    if not paths[0].exists():
        write_sparse_model(paths[0], keys, rows(keys, 4))
        write_sparse_model(paths[1], keys[:10], rows(keys[:10], 8))
    model: dict[str, object] = {
        "model": "demo",
        "embedding_table_names": ["t0", "t1"],
        "embedding_vecsize_per_table": [4, 8],
        "sparse_files": [str(p) for p in paths],
        "gpucache": False,
    }
    if row_dtype is not None:
        model["hps_row_dtype"] = row_dtype
    return make_config(tmp_path, volatile_db={"type": "hash_map", **volatile}, models=[model])


def l3(config: PSConfig) -> Tiers:
    tiers = Tiers.open(config, l3_mode="read_only", l2=False)
    tiers.open_tables(config.tables)
    return tiers


def test_import_records_tables_and_skips_them_next_time(tmp_path: Path) -> None:
    config = two_tables(tmp_path)
    topo = topology(config)
    assert import_tables(config, topo) == {"demo.t0": 100, "demo.t1": 10}
    assert import_tables(config, topo) == {}
    assert import_tables(config, topo, force=True) == {"demo.t0": 100, "demo.t1": 10}
    tiers = l3(config)
    assert tiers.persistent is not None and tiers.persistent.size("demo.t1") == 10
    tiers.close()


def test_a_broken_table_stops_the_import_before_anything_is_written(tmp_path: Path) -> None:
    config = two_tables(tmp_path)
    with open(tmp_path / "t1.model" / "emb_vector", "r+b") as f:
        f.truncate(10 * 8 * 4 - 6)
    with pytest.raises(SparseModelError, match="truncated"):
        import_tables(config, topology(config))
    assert not Path(config.persistent_db.path).exists()  # not even the first table


def test_bad_rows_are_found_before_anything_is_written(tmp_path: Path) -> None:
    config = two_tables(tmp_path)
    bad = rows(np.arange(10), 8)
    bad[3, 1] = np.nan
    write_sparse_model(tmp_path / "t1.model", np.arange(10, dtype=np.int64), bad)
    with pytest.raises(FormatError, match=r"t1.model/emb_vector: row 3 holds NaN"):
        import_tables(config, topology(config))
    assert not Path(config.persistent_db.path).exists()


def test_a_retrained_table_is_imported_again_without_a_record(tmp_path: Path) -> None:
    config = two_tables(tmp_path)
    topo = topology(config)
    import_tables(config, topo)
    assert topo.state_dir is not None
    record = topo.state_dir.with_name(topo.state_dir.name + ".hps-import.json")
    record.unlink()  # e.g. L3 imported by an older release: only L3's content can tell
    assert import_tables(config, topo) == {}  # same files: L3 holds them
    keys = np.arange(10, dtype=np.int64)
    write_sparse_model(tmp_path / "t1.model", keys, rows(keys, 8, seed=5))  # same keys
    record.unlink()
    assert import_tables(config, topo) == {"demo.t1": 10}
    tiers = l3(config)
    got, _ = tiers.persistent.fetch("demo.t1", keys)  # type: ignore[union-attr]
    np.testing.assert_array_equal(got, rows(keys, 8, seed=5))
    tiers.close()


def test_duplicate_keys_are_counted_and_the_last_one_wins(tmp_path: Path, caplog) -> None:
    config = two_tables(tmp_path)
    keys = np.array([1, 2, 1, 3, 2], dtype=np.int64)
    values = rows(np.arange(5), 8)
    write_sparse_model(tmp_path / "t1.model", keys, values)
    assert sparse_source(config.tables[1], tmp_path / "t1.model").validate() == 2
    import_tables(config, topology(config))
    assert "2 duplicate keys" in caplog.text
    tiers = l3(config)
    got, found = tiers.persistent.fetch("demo.t1", np.array([1, 2, 3]))  # type: ignore[union-attr]
    assert found.all()
    np.testing.assert_array_equal(got, values[[2, 4, 3]])
    tiers.close()


def test_loader_fills_a_share_of_l2_and_removes_stale_rows(tmp_path: Path) -> None:
    config = two_tables(tmp_path)
    spec = config.tables[0]
    l2 = HashMapStore()
    tiers = Tiers(l2, Tiers.open(config, l2=False).persistent)
    tiers.open_tables([spec])
    l2.insert(spec.name, np.arange(100, dtype=np.int64), rows(np.arange(100), 4, seed=9))
    source = sparse_source(spec, tmp_path / "t0.model")
    assert Loader(tiers, "fill", 0.25).load(source) == 100
    assert l2.size(spec.name) == 25  # the first quarter; the stale rest left L2
    assert l3_holds(tiers, source)
    assert Loader(tiers, "fill", 0.5, l3=False).load(source) == 50  # a serving process's fill
    tiers.close()


def test_each_l2_action_of_a_load_with_l3(tmp_path: Path) -> None:
    """``invalidate`` removes every row of the table from L2, ``absent`` adds only the rows
    L2 lacks (of its share) and removes nothing, ``fill`` overwrites its share."""
    config = two_tables(tmp_path)
    spec = config.tables[0]
    keys = np.arange(100, dtype=np.int64)
    source = sparse_source(spec, tmp_path / "t0.model")
    for action, share, kept, present in (("invalidate", 1.0, 0, 0), ("absent", 0.5, 10, 60),
                                         ("fill", 0.5, 0, 50)):  # fmt: skip
        l2 = HashMapStore()
        tiers = Tiers(l2, Tiers.open(config, l2=False).persistent)
        tiers.open_tables([spec])
        l2.insert(spec.name, keys[:10], rows(keys[:10], 4, seed=9))  # updated since
        l2.insert(spec.name, keys[90:], rows(keys[90:], 4, seed=9))
        try:
            Loader(tiers, action, share).load(source)  # type: ignore[arg-type]
            values, found = l2.fetch(spec.name, keys)
            assert int(found.sum()) == present, action
            assert np.array_equal(values[:10], rows(keys[:10], 4, seed=9)) == bool(kept), action
        finally:
            tiers.close()


def test_npy_source(tmp_path: Path) -> None:
    config = two_tables(tmp_path)
    spec = config.tables[0]
    keys = np.arange(7, dtype=np.int32)
    np.save(tmp_path / "k.npy", keys.astype(np.int64))
    np.save(tmp_path / "v.npy", rows(keys, 4))
    source = npy_source(spec, tmp_path / "k.npy", tmp_path / "v.npy")
    assert source.rows == 7 and source.validate() == 0
    assert json.dumps(source.stamp()) and json.dumps(source.digest())
    assert [s.spec.name for s in sparse_sources(config)] == ["demo.t0", "demo.t1"]


# -- row formats (hps_row_dtype) --------------------------------------------------------------


def test_tables_are_imported_in_their_row_format(tmp_path: Path) -> None:
    """Each chunk is encoded as it streams: L3 holds exactly the encoded file rows, which
    is also what tells a later import that L3 already holds these files."""
    config = two_tables(tmp_path, ["int8", "float16"])
    topo = topology(config)
    assert import_tables(config, topo) == {"demo.t0": 100, "demo.t1": 10}
    tiers = l3(config)
    try:
        assert tiers.persistent is not None
        for spec, n in zip(config.tables, (100, 10), strict=True):
            keys = np.arange(n, dtype=np.int64)
            got, found = tiers.persistent.fetch(spec.name, keys)
            assert found.all() and got.dtype == spec.fmt.dtype and got.shape[1] == spec.width
            np.testing.assert_array_equal(got, spec.fmt.encode(rows(keys, spec.dim)))
            assert l3_holds(tiers, sparse_source(spec, tmp_path / f"{spec.table}.model"))
    finally:
        tiers.close()
    (tmp_path / "rocksdb.hps-import.json").unlink()  # the record gone: L3 is read
    assert import_tables(config, topo) == {}


def test_float16_out_of_range_is_refused_at_import_naming_the_table(tmp_path: Path) -> None:
    config = two_tables(tmp_path, ["float32", "float16"])
    big = rows(np.arange(10), 8)
    big[4, 2] = 1e5
    write_sparse_model(tmp_path / "t1.model", np.arange(10, dtype=np.int64), big)
    with pytest.raises(InvalidValueError, match=r"demo\.t1: 1 value.*float16.*emb_vector"):
        import_tables(config, topology(config))
    assert not Path(config.persistent_db.path).exists()  # nothing written, not even t0


def test_an_int8_row_too_wide_is_refused_at_import_before_anything_is_written(
    tmp_path: Path,
) -> None:
    config = two_tables(tmp_path, ["int8", "float32"])
    wide = rows(np.arange(100), 4)
    wide[99] = [3e38, -3e38, 0, 0]  # finite, but max - min is beyond float32
    write_sparse_model(tmp_path / "t0.model", np.arange(100, dtype=np.int64), wide)
    with pytest.raises(InvalidValueError, match=r"demo\.t0: 1 row.*span more than float32"):
        import_tables(config, topology(config))
    assert not Path(config.persistent_db.path).exists()  # nothing written


def test_a_format_change_is_refused_then_forced(tmp_path: Path) -> None:
    """Rows of two formats never mix: a changed hps_row_dtype is refused (also when the
    files did not change) until ``force`` drops the table and imports it in its new format."""
    topo = topology(two_tables(tmp_path))
    assert import_tables(two_tables(tmp_path), topo) == {"demo.t0": 100, "demo.t1": 10}
    changed = two_tables(tmp_path, ["int8", "float32"])
    with pytest.raises(ConfigError, match=r"demo\.t0.*float32.*int8.*--force"):
        import_tables(changed, topo)
    assert import_tables(changed, topo, force=True) == {"demo.t0": 100, "demo.t1": 10}
    assert import_tables(changed, topo) == {}
    tiers = l3(changed)
    try:
        assert tiers.persistent is not None
        spec = changed.tables[0]
        got, found = tiers.persistent.fetch(spec.name, np.arange(100, dtype=np.int64))
        assert found.all() and got.dtype == np.uint8
        assert tiers.persistent.size(spec.name) == 100
    finally:
        tiers.close()


def overwrite_l3(config: PSConfig, table: str, keys: np.ndarray, values: np.ndarray) -> None:
    """What a Kafka update or the control plane does: rows of L3 changed in place."""
    tiers = Tiers.open(config, l2=False)
    try:
        tiers.open_tables(config.tables)
        assert tiers.persistent is not None
        tiers.persistent.insert(table, keys, values)
    finally:
        tiers.close()


def holds(config: PSConfig, folder: Path) -> bool:
    tiers = l3(config)
    try:
        return l3_holds(tiers, sparse_source(config.tables[0], folder))
    finally:
        tiers.close()


def test_l3_holds_the_last_occurrence_of_a_duplicated_key(tmp_path: Path) -> None:
    """L3 holds a duplicated key's last row: an earlier occurrence that differs from it is
    forgiven, across chunks too (key 0 at row 0 and again at row 290,000: the second chunk
    of 262,144 rows)."""
    config = two_tables(tmp_path)
    n = 300_000
    keys = np.arange(n, dtype=np.int64)
    keys[290_000] = 0
    vectors = np.arange(4 * n, dtype=np.float32).reshape(n, 4)  # every row its own
    write_sparse_model(tmp_path / "t0.model", keys, vectors)
    import_tables(config, topology(config))
    assert holds(config, tmp_path / "t0.model")
    overwrite_l3(config, "demo.t0", keys[:1], vectors[:1])  # key 0 as in its first row
    assert not holds(config, tmp_path / "t0.model")


def test_l3_holds_gives_up_on_too_many_keys_awaiting_a_later_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys 0-3 twice, in chunks of 4 rows: the first chunk's rows all differ from L3's
    (their keys' last rows), the second undoes that; once more keys wait than
    AWAITED_KEYS the table is taken as not held (and imported again: harmless)."""
    config = two_tables(tmp_path)
    keys = np.array([0, 1, 2, 3, 0, 1, 2, 3], dtype=np.int64)
    write_sparse_model(tmp_path / "t0.model", keys, rows(np.arange(8), 4))
    import_tables(config, topology(config))
    chunks = TableSource.chunks
    monkeypatch.setattr(TableSource, "chunks", lambda self: chunks(self, 4))
    assert holds(config, tmp_path / "t0.model")
    monkeypatch.setattr(loader, "AWAITED_KEYS", 3)
    assert not holds(config, tmp_path / "t0.model")


def test_l3_holds_compares_every_row_not_a_sample(tmp_path: Path) -> None:
    """One row of 100,000 differing (a row that a sample of 64 would miss) is seen."""
    config = two_tables(tmp_path)
    keys = np.arange(100_000, dtype=np.int64)
    write_sparse_model(tmp_path / "t0.model", keys, rows(keys, 4))
    import_tables(config, topology(config))
    assert holds(config, tmp_path / "t0.model")
    overwrite_l3(config, "demo.t0", keys[777:778], rows(keys[777:778], 4, seed=5))
    assert not holds(config, tmp_path / "t0.model")


def test_validation_holds_about_8_bytes_per_key(tmp_path: Path) -> None:
    """Counting duplicates sorts a copy of the keys and compares neighbours in chunks (a
    ``np.unique`` of the keys held about 17 bytes per key more)."""
    import tracemalloc

    config = two_tables(tmp_path)
    n = 4_000_000
    keys = np.arange(n, dtype=np.int64)[::-1].copy()
    keys[-3:] = keys[:3]  # 3 duplicates
    with SparseModelWriter(tmp_path / "big.model") as w:
        w.write(keys, np.zeros((n, 1), np.float32))
    spec = replace(config.tables[0], dim=1)
    source = sparse_source(spec, tmp_path / "big.model")
    del keys
    tracemalloc.start()
    try:
        assert source.validate() == 3
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 11 * n, peak

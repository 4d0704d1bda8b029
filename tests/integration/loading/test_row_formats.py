"""Row formats end to end (docs/config.md: hps_row_dtype): three tables (float32, float16,
int8) imported from HugeCTR sparse-model folders by ``hps import``, looked up through a
LookupSession (L1 on NumPy) over the embedded tiers (hash_map + RocksDB) and over a real
Redis L2, exported (float32 and ``--raw``), and a format change refused, then forced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.config import load_config
from hps.io.sparse_model import KEY_FILE, VECTOR_FILE, read_sparse_model, write_sparse_model
from hps.lookup import LookupSession
from hps.net import free_port
from hps.types import TableSpec
from tests.integration.loading.test_cli_import import hps

pytestmark = pytest.mark.integration

TABLES = (("f32", "float32", 8), ("f16", "float16", 8), ("i8", "int8", 6))
ROWS = 300


def source(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.choice(1 << 40, ROWS, replace=False).astype(np.int64) - (1 << 39)
    values = rng.standard_normal((ROWS, dim), dtype=np.float32) * 4
    values[0] *= 1000  # one wide row: int8's step is per row, float16 stays in range
    return keys, values


def write_ps(root: Path, dtypes: list[str], volatile: dict[str, object] | None = None) -> Path:
    doc = {
        "supportlonglong": True,
        "models": [
            {
                "model": "q",
                "embedding_table_names": [t for t, _, _ in TABLES],
                "embedding_vecsize_per_table": [d for *_, d in TABLES],
                "hps_row_dtype": dtypes,
                "sparse_files": [str(root / t) for t, _, _ in TABLES],
                "default_value_for_each_table": [0.5, -1.0, 2.0],
                "max_batch_size": 1024,
                "gpucache": True,
                "hps_cache": {"capacity": 2 * ROWS, "device": "numpy"},
            }
        ],
        "volatile_db": volatile or {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
    }
    path = root / "ps.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    data = {}
    for i, (table, _, dim) in enumerate(TABLES):
        data[f"q.{table}"] = source(dim, seed=i)
        write_sparse_model(tmp_path / table, *data[f"q.{table}"])
    return data


def assert_within_bound(spec: TableSpec, got: np.ndarray, src: np.ndarray) -> None:
    """Equal to the float32 source within the table's format's bound."""
    err = np.abs(got - src)
    if spec.row_dtype == "float32":
        np.testing.assert_array_equal(got, src)
    elif spec.row_dtype == "float16":
        assert (err <= np.abs(src) * 2.0**-11 + 2.0**-24).all()
    else:
        half_step = (src.max(axis=1) - src.min(axis=1)) / 510
        ulps = 4 * np.spacing(np.abs(src).max(axis=1))
        assert (err <= (half_step + ulps)[:, None]).all()
        assert err.max() > 0  # really quantized


def check_lookups(session: LookupSession, data: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Every row twice (from L2/L3, then from L1), the same, within bound; unknown keys
    get the table's default."""
    for name, (keys, values) in data.items():
        spec = session.tables[name]
        query = np.append(keys, 12345)
        first = session.lookup(name, query)
        session.drain()
        second = session.lookup(name, query)
        np.testing.assert_array_equal(second, first)
        assert_within_bound(spec, first[:-1], values)
        np.testing.assert_array_equal(
            first[:-1], spec.fmt.decode(spec.fmt.encode(values), spec.dim)
        )
        np.testing.assert_array_equal(first[-1], spec.default_value)
        stats = session.stats()["tables"][name]
        assert stats["l1"] == keys.size and stats["l2"] + stats["l3"] == keys.size


@pytest.fixture
def imported(tmp_path: Path, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> Iterator[Path]:
    ps = write_ps(tmp_path, [f for _, f, _ in TABLES])
    done = hps("import", "--config", str(ps))
    assert done.returncode == 0, done.stderr
    for table, _, _ in TABLES:
        assert f"q.{table}: {ROWS} rows" in done.stdout
    yield ps


def test_embedded_tiers_answer_within_each_format_bound(
    imported: Path, tables: dict[str, tuple[np.ndarray, np.ndarray]]
) -> None:
    session = build_session(load_config(imported), l3_mode="read_only")
    try:
        assert session.tiers.persistent is not None
        for name, (keys, values) in tables.items():
            spec = session.tables[name]
            stored, found = session.tiers.persistent.fetch(name, keys)
            assert found.all() and stored.dtype == spec.fmt.dtype
            np.testing.assert_array_equal(stored, spec.fmt.encode(values))  # encoded once
        check_lookups(session, tables)
    finally:
        session.close()


def test_redis_l2_answers_within_each_format_bound(
    tmp_path: Path, tables: dict[str, tuple[np.ndarray, np.ndarray]], redis_address: str
) -> None:
    ps = write_ps(tmp_path, [f for _, f, _ in TABLES], {"type": "redis", "address": redis_address})
    done = hps("import", "--config", str(ps), "--quiet")
    assert done.returncode == 0, done.stderr
    session = build_session(load_config(ps), l3_mode="read_only")
    try:
        assert session.tiers.volatile is not None
        for name, (keys, values) in tables.items():
            spec = session.tables[name]
            stored, found = session.tiers.volatile.fetch(name, keys)  # Redis: filled at import
            assert found.all() and stored.dtype == spec.fmt.dtype
            np.testing.assert_array_equal(stored, spec.fmt.encode(values))
        check_lookups(session, tables)
        assert all(session.stats()["tables"][n]["l2"] == ROWS for n in tables)
    finally:
        session.close()


def test_export_writes_float32_and_raw_writes_the_stored_rows(
    tmp_path: Path, imported: Path, tables: dict[str, tuple[np.ndarray, np.ndarray]]
) -> None:
    config = load_config(imported)
    for spec in config.tables:
        keys, values = tables[spec.name]
        order = np.argsort(keys)
        stored = spec.fmt.encode(values)[order]
        out = tmp_path / "out" / spec.table
        done = hps("export", "--config", str(imported), "--table", spec.name, "--sparse", str(out))
        assert done.returncode == 0, done.stderr
        assert f"{spec.name}: {ROWS} rows (float32)" in done.stdout
        ((k, v),) = read_sparse_model(out, spec.dim, chunk_rows=10 * ROWS)
        at = np.argsort(k)
        np.testing.assert_array_equal(k[at], keys[order])
        np.testing.assert_array_equal(v[at], spec.fmt.decode(stored, spec.dim))

        raw = tmp_path / "raw" / spec.table
        args = ("export", "--config", str(imported), "--table", spec.name, "--raw")
        done = hps(*args, "--sparse", str(raw))
        assert done.returncode == 0, done.stderr
        assert f"{spec.name}: {ROWS} rows (stored {spec.row_dtype} rows)" in done.stdout
        k = np.fromfile(raw / KEY_FILE, dtype="<i8")
        body = np.fromfile(raw / VECTOR_FILE, dtype=np.uint8)
        assert body.size == ROWS * spec.fmt.row_bytes(spec.dim)  # the stored bytes per row
        at = np.argsort(k)
        rows = spec.fmt.from_bytes(body.tobytes(), spec.dim)[at]
        np.testing.assert_array_equal(rows, stored)

        npy = (str(tmp_path / f"{spec.table}.k.npy"), str(tmp_path / f"{spec.table}.v.npy"))
        done = hps(*args, "--npy", *npy)
        assert done.returncode == 0, done.stderr
        vecs = np.load(npy[1])
        assert vecs.dtype == spec.fmt.dtype and vecs.shape == (ROWS, spec.width)
        np.testing.assert_array_equal(vecs[np.argsort(np.load(npy[0]))], stored)

    # the float32 export imports back as it was exported (float32 table: the source itself)
    spec = config.tables[0]
    again = hps(
        "import",
        "--config",
        str(imported),
        "--table",
        spec.name,
        "--sparse",
        str(tmp_path / "out" / spec.table),
        "--force",
        "--quiet",
    )
    assert again.returncode == 0, again.stderr


def test_a_format_change_is_refused_then_forced(
    tmp_path: Path, imported: Path, tables: dict[str, tuple[np.ndarray, np.ndarray]]
) -> None:
    """The same files, q.f32 now int8: `hps import` and `hps serve` refuse with the message
    (no traceback) until `hps import --force` drops the table and imports it as int8."""
    ps = write_ps(tmp_path, ["int8", "float16", "int8"])
    refused = hps("import", "--config", str(ps))
    assert refused.returncode == 2
    assert "q.f32" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr
    ports = [str(free_port()) for _ in range(3)]
    serve = hps(
        "serve",
        "--config",
        str(ps),
        "--http-port",
        ports[0],
        "--grpc-port",
        ports[1],
        "--metrics-port",
        ports[2],
    )
    assert serve.returncode == 2, serve.stdout + serve.stderr
    assert "hps serve: error: table q.f32" in serve.stderr and "--force" in serve.stderr
    assert "Traceback" not in serve.stderr

    forced = hps("import", "--config", str(ps), "--force", "--quiet")
    assert forced.returncode == 0, forced.stderr
    assert f"q.f32: {ROWS} rows" in forced.stdout
    assert hps("import", "--config", str(ps)).returncode == 0
    session = build_session(load_config(ps), l3_mode="read_only")
    try:
        assert session.tables["q.f32"].row_dtype == "int8"
        check_lookups(session, tables)
    finally:
        session.close()

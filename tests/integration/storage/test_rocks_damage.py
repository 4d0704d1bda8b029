"""A damaged RocksDB block (docs/reliability.md): only its keys fail, scans say so, ``hps
verify`` names the table, the start-up L2 fill reports it in ``/readyz``.

Real RocksDB files, damaged by flipping bytes in an SST data block after a flush and a
compaction (tests/integration/storage/damage.py); a real ``hps admin`` under uvicorn.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.errors import BackendError, DamagedRowsError
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import node_file
from hps.net import free_port
from hps.storage.hash_map import HashMapStore
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.triton.serving import fill_l2, serving_config
from hps.types import TableSpec
from tests.helpers import running_admin
from tests.integration.storage.damage import damage, write_table

pytestmark = pytest.mark.integration

ROWS = 20_000
DIM = 16
SPEC = TableSpec("m", "t", DIM)
OTHER = TableSpec("m", "u", DIM)


def _damaged(root: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    path = root / "rocksdb"
    vectors = write_table(path, SPEC, ROWS)
    bad = damage(path, SPEC, ROWS)
    assert 0 < bad.size < ROWS // 10, bad.size  # one block: a few dozen keys
    return path, vectors, bad


def test_a_damaged_block_fails_only_its_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, vectors, bad = _damaged(tmp_path)
    store = RocksDBStore(str(path), mode="read_only")
    store.open_table(SPEC)
    keys = np.arange(ROWS, dtype=np.int64)
    for _ in range(2):  # isolated on the first read, remembered on the second
        with pytest.raises(DamagedRowsError, match=r"keys of m\.t sit in damaged blocks") as err:
            store.fetch(SPEC.name, keys)
        exc = err.value
        assert np.array_equal(np.flatnonzero(exc.damaged), bad)
        good = ~exc.damaged
        assert exc.found[good].all() and not exc.found[bad].any()
        assert np.array_equal(exc.values[good], vectors[good])
    # a batch without damaged keys reads as before
    clean = np.setdiff1d(keys, bad)[:500]
    got, found = store.fetch(SPEC.name, clean)
    assert found.all() and np.array_equal(got, vectors[clean])
    # versions: a damaged row reads as unversioned (an update rewrites it), no raise
    _, has_version = store.fetch_versions(SPEC.name, keys)
    assert has_version[good].all() and not has_version[bad].any()

    # through the tiers: the others served, the damaged ones from L2 where it holds them
    l2 = HashMapStore()
    l2.open_table(SPEC)
    l2.insert(SPEC.name, bad[:5], vectors[bad[:5]])
    tiers = Tiers(l2, store)
    with caplog.at_level(logging.ERROR, "hps.tiers.tiers"):
        fetched = tiers.fetch(SPEC, keys)
    assert np.array_equal(fetched.found, good | np.isin(keys, bad[:5]))
    assert np.array_equal(fetched.values[fetched.found], vectors[fetched.found])
    assert tiers.damaged_keys == bad.size - 5
    assert "m.t" in caplog.text and "damaged" in caplog.text
    tiers.close()


def test_a_rewritten_key_is_read_again(tmp_path: Path) -> None:
    path, vectors, bad = _damaged(tmp_path)
    store = RocksDBStore(str(path))
    store.open_table(SPEC)
    with pytest.raises(DamagedRowsError):
        store.fetch(SPEC.name, bad)
    fresh = np.full((bad.size, DIM), 7.0, np.float32)
    store.insert(SPEC.name, bad, fresh)  # shadows the damaged rows
    got, found = store.fetch(SPEC.name, bad)
    assert found.all() and np.array_equal(got, fresh)
    store.close()


def test_scans_raise_at_the_damage(tmp_path: Path) -> None:
    path, _, _ = _damaged(tmp_path)
    store = RocksDBStore(str(path), mode="read_only")
    store.open_table(SPEC)
    with pytest.raises(BackendError, match=r"m\.t is damaged: a scan stopped after \d+ rows"):
        sum(k.size for k, _ in store.dump(SPEC.name))
    with pytest.raises(BackendError, match=r"m\.t is damaged"):
        store.size(SPEC.name)
    store.close()


def _ps(root: Path, path: Path, l2: str = "hash_map") -> Path:
    """A ps.json over L3 ``path``; its sparse files (what start-up fills name) hold rows of
    the tables' sizes (the fill reads L3, not them)."""
    sparse = []
    for spec, rows in ((SPEC, ROWS), (OTHER, 1000)):
        folder = root / "sparse" / spec.table
        write_sparse_model(folder, np.arange(rows, dtype=np.int64), np.zeros((rows, DIM), "f4"))
        sparse.append(str(folder))
    doc = {
        "models": [
            {
                "model": "m",
                "sparse_files": sparse,
                "embedding_table_names": ["t", "u"],
                "embedding_vecsize_per_table": [DIM, DIM],
                "maxnum_catfeature_query_per_table_per_sample": [4, 4],
                "default_value_for_each_table": [0.0, 0.0],
                "gpucache": False,
            }
        ],
        "volatile_db": {"type": l2, "initial_cache_rate": 1.0},
        "persistent_db": {"type": "rocks_db", "path": str(path)},
    }
    ps = root / "ps.json"
    ps.write_text(json.dumps(doc))
    return ps


def _hps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hps.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_hps_verify_names_the_damaged_table(tmp_path: Path) -> None:
    path = tmp_path / "rocksdb"
    write_table(path, SPEC, ROWS)
    write_table(path, OTHER, 1000, seed=1)
    ps = _ps(tmp_path, path)
    ok = _hps("verify", "--config", str(ps))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok       m.t: 20,000 rows" in ok.stdout and "intact" in ok.stdout
    assert "ok       default (the tables' recorded formats): " in ok.stdout
    damage(path, SPEC, ROWS)
    out = _hps("verify", "--config", str(ps))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "DAMAGED  m.t: Corruption" in out.stdout
    assert "ok       m.u: 1,000 rows" in out.stdout
    assert "damaged: m.t" in out.stdout
    js = _hps("verify", "--config", str(ps), "--json")
    rows = {r["table"]: r for r in map(json.loads, js.stdout.splitlines())}
    assert js.returncode == 1 and not rows["m.t"]["ok"] and rows["m.u"]["ok"]


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A damaged L3, a start-up fill of a serving process's L2, and ``hps admin``."""
    path = tmp_path / "rocksdb"
    write_table(path, SPEC, ROWS)
    write_table(path, OTHER, 1000, seed=1)
    damage(path, SPEC, ROWS)
    ps = _ps(tmp_path, path)
    args = [
        "--config", str(ps),
        "--triton-url", f"127.0.0.1:{free_port()}",  # no Triton: its checks fail, not ours
    ]  # fmt: skip
    with running_admin(args, tmp_path / "admin.log") as (url, _):
        yield url, ps


def _readyz(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_failed_start_up_fill_is_degraded_in_readyz(
    admin: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, ps = admin
    config = serving_config(ps)
    session = build_session(config, l3_mode="read_only")
    try:
        with caplog.at_level(logging.ERROR, "hps.startup"):
            rows = fill_l2(session, config, config.model("m"))  # no raise: it serves on
    finally:
        session.close()
    assert 0 < rows < ROWS + 1000  # m.u whole, m.t up to its damaged block
    assert "L2 fill of m.t from L3 stopped after" in caplog.text
    _, body = _readyz(url)
    checks = {c["name"]: c for c in body["checks"]}  # type: ignore[attr-defined]
    fill = checks["l2_fill"]
    assert fill["ok"] is True and fill["state"] == "degraded", fill
    assert fill["tables"] == ["m.t"] and "Corruption" in fill["detail"], fill
    assert not checks["triton"]["ok"]  # this node has no Triton: the only failing checks


def _on_read_only(cmd: list[str], folder: Path) -> list[str]:
    """``cmd`` with ``folder`` read-only to it: for root (whom permissions do not stop) a
    read-only bind mount of it in a mount namespace of the command's own, as a read-only
    volume is; for anyone else its permissions (the test removes the write bits) do it."""
    if os.geteuid() != 0:
        return cmd
    remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", remount, str(folder), *cmd]


def test_a_read_only_l3_volume_serves() -> None:
    """L3 imported, then its folder (the one the lock would go in) made read-only, with no
    lock and no import record in it: a serving start-up checks, opens, fills and answers."""
    root = Path(tempfile.mkdtemp(prefix="hps-ro-"))
    try:
        root.chmod(0o755)
        data = root / "data"
        keys = np.arange(ROWS // 10, dtype=np.int64) * 3 + 1
        vectors = np.random.default_rng(5).standard_normal((keys.size, DIM)).astype("f4")
        doc = json.loads(_ps(root, data / "rocksdb").read_text())
        write_sparse_model(root / "served" / "t", keys, vectors)
        doc["models"][0]["sparse_files"] = [str(root / "served" / "t")]
        doc["models"][0]["embedding_table_names"] = ["t"]
        doc["models"][0]["embedding_vecsize_per_table"] = [DIM]
        doc["models"][0]["maxnum_catfeature_query_per_table_per_sample"] = [4]
        doc["models"][0]["default_value_for_each_table"] = [0.0]
        (root / "ps.json").write_text(json.dumps(doc))
        done = _hps("import", "--config", str(root / "ps.json"))
        assert done.returncode == 0, done.stderr
        for extra in data.glob("rocksdb.hps-*"):  # a volume holds the database alone
            extra.unlink()
        np.save(root / "keys.npy", keys[::13])
        before = sorted(p.name for p in data.rglob("*"))
        subprocess.run(["chmod", "-R", "a-w", str(data)], check=True)
        worker = [sys.executable, "-m", "tests.integration.storage.read_only_worker"]
        out = subprocess.run(
            _on_read_only([*worker, str(root / "ps.json"), "m.t", str(root / "keys.npy")], data),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parents[3],
        )
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout.splitlines()[-1])
        assert report["imported"] == {} and report["l2_rows"] == keys.size
        assert np.array_equal(np.array(report["out"], dtype="f4"), vectors[::13])
        assert sorted(p.name for p in data.rglob("*")) == before  # nothing written beside
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)
        # the node's files a read-only folder cannot hold went to the temporary directory
        for suffix in (".hps-l2-fill.json", ".hps-l2-fill.lock"):
            node_file(data / "rocksdb", suffix).unlink(missing_ok=True)

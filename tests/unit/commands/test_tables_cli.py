"""`hps import` and `hps export` as a user runs them (in process, real RocksDB files): an
export replaces its files only once complete, writes exactly the paths named in bounded
memory, and a ps.json whose tables no tier outside the serving processes holds is said so."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.cli import main
from hps.errors import BackendError
from hps.io.sparse_model import read_sparse_model
from hps.tiers import Tiers
from tests.helpers import rows, unique_name
from tests.unit.commands.conftest import KEYS


def hps(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def exported(capsys: pytest.CaptureFixture[str], ps_json: Path, *dst: str) -> tuple[int, str]:
    """``hps export`` of table demo.t0 to ``dst``; its status and stderr."""
    code, _, err = hps(capsys, "export", "--config", str(ps_json), "--table", "demo.t0", *dst)
    return code, err


@pytest.fixture
def imported(ps_json: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert hps(capsys, "import", "--config", str(ps_json), "--quiet")[0] == 0
    return ps_json


def dump_failing_after_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """L3 damaged after its first chunk: the scan raises where it stopped."""
    real = Tiers.dump

    def dump(self: Tiers, table: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for keys, stored in real(self, table):
            yield keys[:5], stored[:5]
            raise BackendError(f"rocks_db: {table} is damaged: a scan stopped after 5 rows")

    monkeypatch.setattr(Tiers, "dump", dump)


def test_an_export_that_fails_leaves_the_previous_export_whole(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    backup = tmp_path / "backup"
    npy = [str(tmp_path / "k.npy"), str(tmp_path / "v.npy")]
    assert exported(capsys, imported, "--sparse", str(backup))[0] == 0
    assert exported(capsys, imported, "--npy", *npy)[0] == 0
    before = {p: p.read_bytes() for p in [backup / "key", backup / "emb_vector", *map(Path, npy)]}
    dump_failing_after_one_chunk(monkeypatch)
    for dst in (["--sparse", str(backup)], ["--npy", *npy]):
        code, err = exported(capsys, imported, *dst)
        assert code == 2 and err.count("\n") == 1 and "is damaged" in err, err
        assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in backup.iterdir()) == ["emb_vector", "key"]  # no temporaries
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".npy") == ["k.npy", "v.npy"]
    ((keys, vectors),) = read_sparse_model(backup, 4)
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], KEYS)
    np.testing.assert_array_equal(vectors[order], rows(KEYS, 4))


def test_export_npy_writes_exactly_the_paths_named(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert exported(capsys, imported, "--npy", str(out / "keys"), str(out / "vectors"))[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["keys", "vectors"]
    args = ["--table", "demo.t0", "--npy", str(out / "keys"), str(out / "vectors"), "--quiet"]
    code, text, err = hps(capsys, "import", "--config", str(imported), *args)
    assert code == 0 and text == "demo.t0: 40 rows\n", err  # other bytes than the import's
    code, text, err = hps(capsys, "import", "--config", str(imported), *args)
    assert code == 0 and text == "demo.t0: unchanged (already imported)\n", err
    keys, vectors = np.load(out / "keys"), np.load(out / "vectors")
    np.testing.assert_array_equal(vectors[np.argsort(keys)], rows(KEYS, 4))


@pytest.mark.parametrize("second", ["k.npy", "./sub/../k.npy"])
def test_export_npy_refuses_one_file_named_twice(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch, second: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "k.npy").write_bytes(b"kept")
    code, err = exported(capsys, imported, "--npy", "k.npy", second)
    assert code == 2
    assert err == f"hps export: error: --npy k.npy {second}: name two different files\n"
    assert (tmp_path / "k.npy").read_bytes() == b"kept"


def test_export_npy_holds_a_chunk_not_the_table(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """64 chunks of 16,384 rows (16 MiB of vectors): the export's memory stays near a
    chunk's (256 KiB of vectors), where holding the table would take 16 MiB and more."""
    chunk, count = 16_384, 64

    def dump(self: Tiers, table: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(count):
            keys = np.arange(i * chunk, (i + 1) * chunk, dtype=np.int64)
            yield keys, np.ones((chunk, 4), np.float32)

    monkeypatch.setattr(Tiers, "dump", dump)
    npy = [str(tmp_path / "k.npy"), str(tmp_path / "v.npy")]
    tracemalloc.start()
    try:
        code, err = exported(capsys, imported, "--npy", *npy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0, err
    assert np.load(npy[1], mmap_mode="r").shape == (chunk * count, 4)
    np.testing.assert_array_equal(np.load(npy[0]), np.arange(chunk * count))
    assert peak < 4 << 20, peak


@pytest.fixture
def no_l3(tmp_path: Path, ps_json: Path) -> Path:
    """The ps.json with no L3 and an in-process L2: serving processes hold the only rows."""
    doc = json.loads(ps_json.read_text())
    doc["persistent_db"] = {"type": "disabled"}
    path = tmp_path / "ps_nol3.json"
    path.write_text(json.dumps(doc))
    return path


def test_import_without_l3_or_a_shared_l2_says_there_is_nothing_to_import(
    no_l3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = hps(capsys, "import", "--config", str(no_l3))
    assert code == 0 and out.startswith("nothing to import: no L3") and "unchanged" not in out
    assert out.count("\n") == 1
    table = ["--table", "demo.t0", "--sparse", str(tmp_path / "v1" / "t0")]
    code, out, err = hps(capsys, "import", "--config", str(no_l3), *table)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("hps import: error: demo.t0: nothing to import into: no L3")


def test_export_without_l3_or_a_shared_l2_is_refused(
    no_l3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = exported(capsys, no_l3, "--sparse", str(tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("hps export: error: nothing to export from: no L3")
    assert not (tmp_path / "out").exists()


def test_lookup_without_l3_or_a_shared_l2_is_refused(
    no_l3: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It would answer every key with the default: this process's own L2 is empty."""
    code, out, err = hps(capsys, "lookup", "--config", str(no_l3), "--table", "demo.t0", "1")
    assert code == 2 and out == ""
    assert err.startswith("hps lookup: error: nothing to look up in: no L3")


def test_import_of_several_instances_fills_the_l2_serving_opens(
    no_l3: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model of 2 instances whose ps.json names no L2 type is served on the node's shared
    L2, so hps import fills that one (here the only tier): not 'nothing to import'."""
    doc = json.loads(no_l3.read_text())
    doc["models"][0]["hps_instances"] = 2
    doc["volatile_db"] = {"shared_memory_name": unique_name("hps_test_import"),
                          "shared_memory_size": 64 * 1024**2}  # fmt: skip
    no_l3.write_text(json.dumps(doc))
    code, out, err = hps(capsys, "import", "--config", str(no_l3), "--quiet")
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"demo.{t}: {KEYS.size} rows" for t in ("t0", "t1")]


def test_import_refuses_a_shared_l2_without_an_entry_for_each_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """257 tables in the 256 entries of the L2 that 2 instances share: one line, before
    anything is written (hps serve would fail in Triton's start-up)."""
    doc = {
        "models": [{"model": "many", "embedding_vecsize_per_table": [4] * 257,
                    "sparse_files": [str(tmp_path / f"t{i}") for i in range(257)],
                    "hps_instances": 2}],
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "many_l3")},
    }  # fmt: skip
    path = tmp_path / "many.json"
    path.write_text(json.dumps(doc))
    code, out, err = hps(capsys, "import", "--config", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "holds at most 256 tables; the models need 257" in err
    assert not (tmp_path / "many_l3").exists()


@pytest.mark.parametrize(
    "dst",
    [
        ["--npy", "rocksdb/CURRENT", "v.npy"],
        ["--npy", "k.npy", "rocksdb/new.npy"],
        ["--sparse", "rocksdb"],
        ["--sparse", "rocksdb/sub/dir"],
        ["--sparse", "rocksdb.hps-versions/demo"],
        ["--npy", "rocksdb.hps-versions.json", "v.npy"],
    ],
)
def test_an_export_into_l3_or_the_state_beside_it_is_refused(
    dst: list[str], imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    l3 = tmp_path / "rocksdb"
    before = {p.name: p.read_bytes() for p in l3.iterdir() if p.is_file()}
    monkeypatch.chdir(tmp_path)
    code, err = exported(capsys, imported, *dst)
    assert code == 2, err
    assert "inside" in err and "export to a path outside" in err
    assert {p.name: p.read_bytes() for p in l3.iterdir() if p.is_file()} == before
    assert hps(capsys, "lookup", "--config", str(imported), "--table", "demo.t0", "1")[0] == 0


def test_an_export_beside_l3_is_written(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = exported(capsys, imported, "--sparse", str(tmp_path / "rocksdb-backup"))
    assert code == 0, err
    assert (tmp_path / "rocksdb-backup" / "key").is_file()

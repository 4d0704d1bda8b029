"""A table whose validation needs more memory than the machine (or its cgroup) has left is
refused before anything is read, naming the table, its file and both figures; files made
sparse with truncate, the memory available patched: no test exhausts memory."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from hps.config import PSConfig
from hps.errors import HPSError
from hps.loading import loader
from hps.loading.imports import import_tables
from hps.loading.loader import TableSource, available_memory, sparse_source
from hps.topology import topology
from tests.helpers import make_config

ROWS = 1 << 33  # 64 GiB of keys: more than any test machine holds


def sparse_table(folder: Path, rows: int, dim: int = 1) -> Path:
    """A sparse-model folder of ``rows`` rows whose files take no disk (truncate)."""
    folder.mkdir(parents=True)
    for name, size in (("key", rows * 8), ("emb_vector", rows * dim * 4)):
        with open(folder / name, "wb") as f:
            os.truncate(f.fileno(), size)
    return folder


def config(tmp_path: Path) -> PSConfig:
    model = {
        "model": "m",
        "embedding_table_names": ["t"],
        "embedding_vecsize_per_table": [1],
        "sparse_files": [str(tmp_path / "t.model")],
        "gpucache": False,
    }
    return make_config(tmp_path, models=[model])


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(loader, "available_memory", lambda: 1 << 30)
    return 1 << 30


def test_validation_is_refused_unread_when_its_keys_do_not_fit(
    tmp_path: Path, little_memory: int
) -> None:
    cfg = config(tmp_path)
    source = sparse_source(cfg.tables[0], sparse_table(tmp_path / "t.model", ROWS))
    with pytest.raises(HPSError) as err:
        source.validate()
    message = str(err.value)
    assert message.startswith("m.t: ") and str(tmp_path / "t.model") in message
    assert f"needs {source.validation_bytes:,} bytes" in message and f"{ROWS:,} keys" in message
    assert f"{little_memory:,} bytes available" in message
    assert "\n" not in message


def test_an_import_is_refused_before_its_files_are_read(
    tmp_path: Path, little_memory: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path)
    sparse_table(tmp_path / "t.model", 1 << 27)  # 1 GiB of keys, 1 GiB more than free

    def read(self: TableSource) -> str:
        raise AssertionError(f"{self.where} read before the memory check")

    monkeypatch.setattr(TableSource, "digest", read)
    with pytest.raises(HPSError, match=r"m\.t: .*bytes of memory"):
        import_tables(cfg, topology(cfg))


def test_a_table_that_fits_is_validated(tmp_path: Path, little_memory: int) -> None:
    cfg = config(tmp_path)
    source = sparse_source(cfg.tables[0], sparse_table(tmp_path / "t.model", 1000))
    assert source.validate() == 999  # every key 0: all but one repeat it
    assert replace(source, rows=ROWS).validation_bytes > little_memory


def test_available_memory_is_the_lesser_of_the_machine_and_the_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  4000 kB\nMemFree: 100 kB\nMemAvailable:  3000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    monkeypatch.setattr(loader, "MEMINFO", meminfo)
    monkeypatch.setattr(loader, "CGROUP", cgroup)
    assert available_memory() == 3000 * 1024  # no cgroup limit files
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1000\n")
    assert available_memory() == 3000 * 1024  # no limit
    (cgroup / "memory.max").write_text("1000000\n")
    assert available_memory() == 999_000
    (cgroup / "memory.current").write_text("2000000\n")  # over its limit
    assert available_memory() == 0
    (cgroup / "memory.stat").write_text("anon 500000\ninactive_file 1500000\n")
    assert available_memory() == 500_000  # page cache it reclaims first counts as free
    (cgroup / "memory.stat").write_text("anon 2000000\n")
    meminfo.write_text("MemTotal: 4000 kB\n")  # a kernel without MemAvailable
    assert available_memory() == 0
    os.remove(cgroup / "memory.max")
    assert available_memory() is None  # nothing known: nothing refused

"""numba installed but unable to compile or cache the key index's loops (no writable cache
folder for this user: numba's "no locator available"): the NumPy loops run, after one
warning."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import hps.index
import hps.jit
from hps.cli import main
from hps.index import KeyIndex, compiled
from tests.helpers import rows
from tests.unit.commands.conftest import write_ps_json

numba_caching = pytest.importorskip("numba.core.caching")


@pytest.fixture
def no_cache_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every numba cache locator refuses, and the compiled modules are imported afresh."""
    for cls in numba_caching.CacheImpl._locator_classes:
        monkeypatch.setattr(cls, "from_function", classmethod(lambda cls, f, s: None))
    monkeypatch.delitem(sys.modules, "hps.index._numba", raising=False)
    monkeypatch.delattr(hps.index, "_numba", raising=False)
    monkeypatch.setattr(hps.jit, "_warned", set())
    monkeypatch.delenv("HPS_KERNELS", raising=False)
    compiled.cache_clear()
    yield
    compiled.cache_clear()  # the next test loads the real loops again


def test_the_numpy_loops_run_with_one_warning(
    no_cache_folder: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="hps.jit")
    assert compiled() is None
    assert compiled() is None  # asked again: no second warning
    warnings = [r for r in caplog.records if r.name == "hps.jit" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no locator available" in warnings[0].getMessage()
    assert "uses the NumPy paths" in warnings[0].getMessage()

    index = KeyIndex(16)
    assert index._jit is None
    keys = np.arange(100, 1100, 7, dtype=np.int64)
    index.insert(keys, np.arange(keys.size))
    assert index.lookup(keys).tolist() == list(range(keys.size))
    assert index.lookup(np.array([1, 3], np.int64)).tolist() == [-1, -1]


def test_lookup_answers_from_the_numpy_loops(
    no_cache_folder: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps_json = str(write_ps_json(tmp_path))
    assert main(["import", "--config", ps_json, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["lookup", "--config", ps_json, "--table", "demo.t0", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["vector"]
    assert got == rows(np.array([3], np.int64), 4, 0)[0].tolist()
    assert compiled() is None

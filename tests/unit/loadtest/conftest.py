"""The demo ps.json the load-test units draw their keys from, and its tables' vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.ctr.demo import create_demo, table_sizes, table_vectors


def vectors_of(table: int, keys: np.ndarray, dim: int = 4) -> np.ndarray:
    """The demo's vectors of ``keys`` (table ``table`` holds keys 0 .. rows - 1 in order)."""
    rows = table_sizes(3, 3000)[table]
    return table_vectors(np.arange(rows, dtype=np.int64), dim, table)[keys]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_demo(tmp_path_factory.mktemp("demo"), num_tables=3, max_rows=3000, dim=4)

"""Small helpers of the control-plane tests: Triton lookups and the stub of a model."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hps.triton.client import Client


def triton_rows(url: str, model: str, tables: int, index: int, keys: np.ndarray) -> np.ndarray:
    """Vectors of ``keys`` of the model's ``index``-th table, through Triton."""
    numkeys = np.zeros(tables, dtype=np.int32)
    numkeys[index] = keys.size
    with Client(url) as c:
        return c.lookup(model, keys, numkeys).reshape(keys.size, -1)


def concurrent_rows(
    url: str, model: str, tables: int, index: int, keys: np.ndarray, n: int = 16
) -> list[np.ndarray]:
    """``n`` concurrent identical requests: with several instances, more than one answers."""
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(triton_rows, url, model, tables, index, keys) for _ in range(n)]
        return [f.result() for f in futures]


def stub_pids(repository: Path, model: str) -> list[int]:
    """PIDs of the Python-backend stubs serving ``model`` (found in /proc by their args)."""
    pids = []
    needle = str(repository / model).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"triton_python_backend_stub" in cmdline and needle + b"/" in cmdline:
            pids.append(int(entry))
    return pids

"""Every L1 test runs on each usable array module: NumPy here, CuPy too on a GPU; the tests
about rows run for each row format too (``fmt``). ``cuda_lib``: the GPU kernels built for
the CPU, once per session; ``gpu``: caches on a GPU per usable array module, the emulated
one on NumPy, the real one on CuPy (cuda_emulation.GpuCaches)."""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pytest

from hps.cache.xp import available_xps
from hps.rowformat import FORMATS, RowFormat

if TYPE_CHECKING:
    from tests.unit.cache.cuda_emulation import GpuCaches

XPS = available_xps()


@pytest.fixture(params=XPS, ids=[m.__name__ for m in XPS])
def xp(request: pytest.FixtureRequest) -> ModuleType:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=list(FORMATS.values()), ids=list(FORMATS))
def fmt(request: pytest.FixtureRequest) -> RowFormat:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def cuda_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The GPU kernels' CUDA source built for the CPU, warps emulated (cuda_emulation)."""
    from tests.unit.cache.cuda_emulation import build

    return build(tmp_path_factory.mktemp("cuda-source"))


@pytest.fixture(scope="session", params=XPS, ids=[m.__name__ for m in XPS])
def gpu(request: pytest.FixtureRequest) -> GpuCaches:
    """Caches on a GPU: the emulated one on NumPy, the real one on CuPy."""
    from tests.unit.cache.cuda_emulation import GpuCaches

    xp = request.param
    return GpuCaches(xp, request.getfixturevalue("cuda_lib") if xp is np else None)

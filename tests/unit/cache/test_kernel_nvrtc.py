"""The GPU kernels' source through the real NVRTC, so its dialect is checked without a GPU.

NVRTC comes from the ``nvidia-cuda-nvrtc-cu12`` wheel (a ``dev`` dependency: this test runs
wherever the suite does) and is called through ctypes as CuPy calls it: the source of
:func:`hps.cache.kernels_cupy.kernel_source` with CuPy's options, for the architectures of
the GPUs we serve on (A100: compute_80, H100/H200: compute_90). A failure shows NVRTC's log;
a warning fails too. The CPU build (test_kernel_cuda_source.py) checks what the kernels do.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import nvidia.cuda_nvrtc
import pytest

from hps.cache.kernels_cupy import KERNELS, NVRTC_OPTIONS, kernel_source


def _nvrtc() -> ctypes.CDLL:
    folder = Path(next(iter(nvidia.cuda_nvrtc.__path__)), "lib")
    return ctypes.CDLL(str(folder / "libnvrtc.so.12"))


def _text(lib: ctypes.CDLL, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> str:
    size = ctypes.c_size_t()
    assert getattr(lib, size_fn)(prog, ctypes.byref(size)) == 0
    buf = ctypes.create_string_buffer(size.value)
    assert getattr(lib, get_fn)(prog, buf) == 0
    return buf.value.decode()


def compile_ptx(source: str, options: list[str]) -> tuple[int, str, str]:
    """NVRTC's result code, log and PTX for ``source`` compiled with ``options``."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    made = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"hps_l1.cu", 0, None, None)
    assert made == 0, f"nvrtcCreateProgram: {made}"
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        code = lib.nvrtcCompileProgram(prog, len(options), opts)
        log = _text(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
        ptx = _text(lib, prog, "nvrtcGetPTXSize", "nvrtcGetPTX") if code == 0 else ""
        return code, log, ptx
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_nvrtc_compiles_every_kernel(arch: str) -> None:
    code, log, ptx = compile_ptx(kernel_source(), [*NVRTC_OPTIONS, f"--gpu-architecture={arch}"])
    assert code == 0, f"NVRTC failed ({code}):\n{log}"
    assert "warning" not in log.lower(), log
    for name in KERNELS:
        assert f".entry {name}(" in ptx, f"no kernel {name} in the PTX"


def test_nvrtc_reports_a_broken_source() -> None:
    """The harness sees NVRTC's errors (so a pass above means something)."""
    code, log, _ = compile_ptx(kernel_source() + "\nint broken(", ["--gpu-architecture=compute_90"])
    assert code != 0 and "error" in log

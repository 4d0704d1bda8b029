"""The device's pinned response buffer (``Device.response``): host answers of caches on a GPU.

The rows come back from the device straight into it, and Triton copies the answer out of it
after ``execute`` returns, so it must stay reserved while any view of an answer lives (a
DLPack consumer's included), and an answer asked for meanwhile goes to other memory.
"""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import numpy as np
import pytest

from hps.cache.device import MIN_BUFFER, CupyDevice, Device, address, grown
from hps.cache.kernels_cupy import tables_layout
from hps.cache.xp import available_xps
from tests.unit.cache.cuda_emulation import EmulatedDevice, GpuCaches
from tests.unit.cache.test_rows_on_gpu import DIMS, CopyCounter, _device, _session


def _buffer(device: Device) -> int:
    assert device._response is not None
    return address(device._response)


@pytest.fixture(params=[m.__name__ for m in available_xps()])
def device(request: pytest.FixtureRequest, cuda_lib: ctypes.CDLL) -> Device:
    """An emulated device here; on a GPU the real one too (its buffer page-locked)."""
    if request.param == "numpy":
        return EmulatedDevice(cuda_lib)
    return CupyDevice(0)


def _page_locked(device: Device, a: np.ndarray) -> bool:
    if not isinstance(device, CupyDevice):
        return False
    memory_type = device.xp.cuda.runtime.pointerGetAttributes(address(a)).type
    return bool(memory_type == device.xp.cuda.runtime.memoryTypeHost)


def test_an_answer_reserves_the_buffer_until_its_last_view_is_gone(device: Device) -> None:
    answer = device.response(1000)
    assert answer.dtype == np.float32 and answer.shape == (1000,) and answer.flags.writeable
    assert address(answer) == _buffer(device)
    assert _page_locked(device, answer) == isinstance(device, CupyDevice)
    assert device.held().pinned == grown(4000)
    answer[:] = 7.0
    row = answer.reshape(1, -1)  # as the Triton adapter hands it on
    consumer = np.from_dlpack(row)  # as Triton's output tensor holds it
    del answer, row
    gc.collect()
    other = device.response(1000)  # the first answer is still being sent
    assert not np.shares_memory(other, consumer) and not _page_locked(device, other)
    other[:] = 1.0
    assert (consumer == 7.0).all()
    del consumer
    gc.collect()
    assert address(device.response(10)) == _buffer(device)  # free again: reused, not grown
    assert device.held().pinned == grown(4000)


def test_the_buffer_grows_to_powers_of_two(device: Device) -> None:
    assert device.response(0).size == 0 and device.held().pinned == 0
    small = device.response(10)
    assert device.held().pinned == MIN_BUFFER
    del small
    assert device.response(MIN_BUFFER).size == MIN_BUFFER  # 4 * MIN_BUFFER bytes
    assert device.held().pinned == 4 * MIN_BUFFER


def test_host_answers_come_back_once_into_the_response_buffer(
    gpu: GpuCaches, tmp_path: Path
) -> None:
    """A lookup answered on the host by caches on a GPU: the rows cross once, into the
    response buffer; an answer still held is never overwritten by the next one."""
    on_gpu, host = _session(tmp_path, gpu, 40), _session(tmp_path, None, 40)
    device = _device(on_gpu)
    copies = CopyCounter(device)
    keys = np.array([0, 2, 5, 2, 4, 6, 8, 1, 2], dtype=np.int64)
    counts = np.array([3, 4, 2], dtype=np.int32)
    try:
        want = host.lookup_request("demo", keys, counts)
        first = on_gpu.lookup_request("demo", keys, counts)
        np.testing.assert_array_equal(first, want)
        assert address(first) == _buffer(device)
        rows = 4 * (3 * DIMS[0] + 4 * DIMS[1])  # both cached tables' rows, adjacent: one copy
        assert copies.to_host[0] == rows
        assert copies.to_host[1:] == [tables_layout(keys.size, 2, 0).out_bytes]  # misses, tallies
        kept = first.copy()
        second = on_gpu.lookup_request("demo", keys[::-1].copy(), counts[::-1].copy())
        assert not np.shares_memory(first, second)
        np.testing.assert_array_equal(first, kept)
        np.testing.assert_array_equal(
            second, host.lookup_request("demo", keys[::-1].copy(), counts[::-1].copy())
        )
        del first, second
        gc.collect()
        assert address(on_gpu.lookup_request("demo", keys, counts)) == _buffer(device)
    finally:
        copies.close()
        on_gpu.close()
        host.close()

"""The GPU probe+gather: CUDA kernels with the contract of :mod:`hps.cache.kernels`, and the
host path that feeds them.

The kernels (:mod:`hps.cache.cuda_probe`: one table, every table of a request;
:mod:`hps.cache.cuda_write`: placing and overwriting rows, scattering rows found below L1)
are warp-cooperative: a tile of 8, 16 or 32 lanes per key probes the key's slot group in
parallel and copies its row with coalesced (vector, where aligned) stores, dequantizing
float16 and int8 rows as it copies.
Ticks, distinct hits, saturating counts and misses (returned in request order) keep the
contract of the CPU kernel; distinct hits are added once per warp and table, misses once
per warp step that has any.

The host path (:class:`GpuProbe`, :func:`run_tables`) runs on a :class:`hps.cache.device.Device`:
keys go into a pinned staging buffer and to the device in one asynchronous copy; the rows
come back in one copy straight into the caller's buffer (one per run of adjacent tables),
the miss list and the tallies in one more into pinned memory; the host waits once. Where
the answer leaves the process the caller's buffer is the device's pinned response buffer
(:meth:`hps.cache.device.Device.response`), so the rows cross the bus at its pinned speed
and no host copy follows. Staging buffers and the stream are the GPU's (one device per GPU
and process, shared by its caches, held under its lock by each call), reused and grown,
never allocated per call.

Compiled by NVRTC on first use (CuPy's ``RawModule``; CuPy keeps the binary in its on-disk
kernel cache). Where no GPU is lent, tests compile the same source as C++ and run every warp
as 32 threads that meet at each warp intrinsic (tests/unit/cache/test_kernel_cuda_source.py),
and compile it with the real NVRTC (tests/unit/cache/test_kernel_nvrtc.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from hps.cache.cuda_probe import PROBE_SOURCE
from hps.cache.cuda_request import REQUEST_SOURCE
from hps.cache.cuda_write import WRITE_SOURCE
from hps.cache.device import Device, KernelArgs, address
from hps.cache.kernels import DESCRIPTOR, FORMAT_CODES
from hps.index import EMPTY, GROUP, TOMBSTONE
from hps.types import Array

if TYPE_CHECKING:
    from hps.cache.rows import RowStore

THREADS = 256  # per block: 8 warps
KERNELS = (
    "probe_gather", "probe_gather_tables", "place_rows", "write_rows", "scatter_rows", "pool_rows",
)  # fmt: skip
NULL = np.uint64(0)  # a null pointer argument
NVRTC_OPTIONS = ("--std=c++17",)  # CuPy adds the GPU's architecture
PLAN = ("first", "end", "out_offset", "first_warp", "tile", "vector")  # run_tables' plan row


def kernel_source() -> str:
    """The kernels' CUDA source with the index's constants and the format codes defined."""
    defines = (
        f"#define GROUP {GROUP}\n#define EMPTY_KEY ({int(EMPTY) + 1}LL - 1LL)\n"
        f"#define TOMB ({int(TOMBSTONE)}LL)\n"
        f"#define FORMAT_FLOAT16 {FORMAT_CODES['float16']}\n"
        f"#define FORMAT_INT8 {FORMAT_CODES['int8']}\n"
    )
    return defines + PROBE_SOURCE + WRITE_SOURCE + REQUEST_SOURCE


def tile_for(dim: npt.ArrayLike) -> npt.NDArray[np.int_]:
    """Lanes per key for rows of ``dim`` (an int or an int array): 8 up to dim 32 (8
    vectors of 4), 16 up to 64, else a whole warp. Probes use 8 lanes (one group)."""
    return np.where(np.asarray(dim) <= 32, 8, np.where(np.asarray(dim) <= 64, 16, 32))


def blocks_for(warps: int, device: Device) -> int:
    """Blocks of :data:`THREADS` for ``warps`` warps of work: at least 1, at most what
    ``device`` runs at once (:attr:`hps.cache.device.Device.resident_threads`). The kernels
    loop over their work grid-stride, so a larger request gives each warp more steps rather
    than queueing blocks, and a warp's atomics (added once per warp) stay few."""
    return max(1, min(device.resident_threads // THREADS, -(-warps // (THREADS // 32))))


def pad(nbytes: int) -> int:
    """``nbytes`` rounded up to 16 (where a part of a staging buffer starts)."""
    return -(-nbytes // 16) * 16


def kernel_arguments(rows: RowStore, keys: Array, out: Array, tick: int, counts: Array | None,
                     cap: int, miss: Array, tallies: Array, tile: int | None = None
                     ) -> KernelArgs:  # fmt: skip
    """``probe_gather``'s arguments in its order, for arrays of ``rows.xp`` (device arrays on
    a GPU; host arrays where tests run the source compiled for the CPU): the arena of stored
    rows with its width and format code (:data:`hps.cache.kernels.FORMAT_CODES`), whether
    rows may be copied as 4-element vectors, the tile, ``keys`` int64 ``[n]``, ``out``
    float32 ``[n * dim]``, ``miss`` int64 ``[>= n]``, ``tallies`` uint64 ``[2]`` (zeros; the
    kernel adds the misses and the distinct hits)."""
    index, dim = rows.index, rows.dim
    vec = dim % 4 == 0 and address(rows.values) % 16 == 0 and address(out) % 16 == 0
    return (
        index.slot_keys, index.slot_rows, np.int64(index.gmask), rows.values,
        np.int32(dim), np.int32(rows.width), np.int32(FORMAT_CODES[rows.fmt.name]),
        np.int32(vec), np.int32(tile_for(dim) if tile is None else tile),
        keys, np.int64(keys.shape[0]), out, rows.ticks.view(np.uint64), np.uint64(tick),
        NULL if counts is None else counts, np.int32(counts is not None), np.int32(cap),
        miss, tallies,
    )  # fmt: skip


class GpuProbe:
    """A cache's probe+gather on ``device`` with :data:`hps.cache.kernels.CacheKernel`'s
    signature: host keys in, rows into the host ``out``; (sorted miss positions, distinct
    hits) back. ``tile`` forces the lanes per key (tests); else :func:`tile_for`."""

    def __init__(self, device: Device, tile: int | None = None) -> None:
        self.device = device
        self.tile = tile

    def __call__(self, rows: RowStore, keys: np.ndarray, out: np.ndarray, tick: int,
                 counts: Array | None, cap: int) -> tuple[np.ndarray, int]:  # fmt: skip
        n, dev = int(keys.shape[0]), self.device
        if n == 0:
            return np.zeros(0, np.int64), 0
        row_bytes = n * rows.dim * 4
        miss_at = pad(row_bytes)
        tally_at = miss_at + 8 * n
        with dev.lock:
            staged = dev.pinned("keys", 8 * n)
            staged.view(np.int64)[:] = keys
            keys_d = dev.buffer("keys", 8 * n)
            dev.to_device(keys_d, staged)
            result = dev.buffer("out", tally_at + 16)
            self.on_device(rows, keys_d.view(np.int64), result[:row_bytes].view(np.float32),
                           tick, counts, cap, result[miss_at:tally_at].view(np.int64),
                           result[tally_at:].view(np.uint64))  # fmt: skip
            dev.to_host(out.reshape(-1).view(np.uint8), result[:row_bytes])  # C-contiguous
            back = dev.pinned("out", tally_at + 16 - miss_at)
            dev.to_host(back, result[miss_at:])
            dev.synchronize()
            n_miss, n_hit = (int(t) for t in back[tally_at - miss_at :].view(np.uint64))
            return np.sort(back[: 8 * n].view(np.int64)[:n_miss]), n_hit

    def on_device(self, rows: RowStore, keys: Array, out: Array, tick: int,
                  counts: Array | None, cap: int, miss: Array, tallies: Array) -> None:  # fmt: skip
        """Queue the kernel over device ``keys`` into device ``out`` (flat ``[n * dim]``):
        ``miss`` int64 ``[n]`` gets the misses' positions (unsorted), ``tallies`` uint64
        ``[2]`` the misses and distinct hits (zeroed here). The host path's core; the
        benchmark times it alone (the device-only figure)."""
        n = int(keys.shape[0])
        self.device.zero(tallies)
        args = kernel_arguments(rows, keys, out, tick, counts, cap, miss, tallies, self.tile)
        warps = -(-n // (32 // int(args[8])))
        self.device.launch("probe_gather", blocks_for(warps, self.device), THREADS, args)


class TablesLayout(NamedTuple):
    """Byte offsets of :func:`run_tables`' two staging transfers. In (buffer ``keys``):
    keys | descriptors | plans; out (buffer ``out``): rows | miss positions | tallies."""

    desc_at: int
    plan_at: int
    in_bytes: int
    miss_at: int
    tally_at: int
    out_bytes: int


def tables_layout(n_keys: int, n_tables: int, row_bytes: int) -> TablesLayout:
    """The layout for ``n_keys`` keys of ``n_tables`` tables whose rows take ``row_bytes``
    (float32) bytes: each part 16-byte aligned where the kernel reads it as vectors."""
    desc_at = pad(8 * n_keys)
    plan_at = desc_at + 8 * len(DESCRIPTOR) * n_tables
    miss_at = pad(row_bytes)
    tally_at = miss_at + 8 * n_keys
    return TablesLayout(
        desc_at, plan_at, plan_at + 8 * len(PLAN) * n_tables, miss_at, tally_at,
        tally_at + 16 * n_tables,
    )  # fmt: skip


def run_tables(
    device: Device,
    desc: np.ndarray,
    keys: np.ndarray,
    bounds: np.ndarray,
    out: Array,
    out_offsets: np.ndarray,
    *,
    out_on_device: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``probe_gather_tables`` on ``device``: the tables of ``desc`` (int64 ``[T, 13]``,
    :data:`hps.cache.kernels.DESCRIPTOR`, device addresses) with their keys at ``bounds``,
    rows into ``out`` (flat float32) from ``out_offsets``; one copy each way.

    ``out`` is a host buffer (the rows come back with the misses and tallies), or with
    ``out_on_device`` a buffer of ``device`` that the kernel writes itself (only the misses
    and tallies come back: the rows never cross to the host).

    Returns per table (misses, distinct hits) (int64 ``[T, 2]``) and the miss positions
    (int64 ``[n]``: table ``t``'s from ``bounds[t, 0]``, sorted), as the CPU kernel."""
    n_tables, n = int(desc.shape[0]), int(keys.size)
    if n_tables == 0:
        return np.zeros((0, 2), np.int64), np.zeros(n, np.int64)
    dims, lo, hi = desc[:, 5], bounds[:, 0], bounds[:, 1]
    tiles = tile_for(dims).astype(np.int64)
    warps = -(-(hi - lo) // (32 // tiles))
    first_warp = np.cumsum(warps) - warps
    ends = out_offsets + (hi - lo) * dims
    vec = (dims % 4 == 0) & (desc[:, 4] % 16 == 0) & (out_offsets % 4 == 0)
    vec &= not out_on_device or address(out) % 16 == 0  # the staging buffer is aligned
    plan = np.stack([lo, hi, out_offsets, first_warp, tiles, vec.astype(np.int64)], axis=1)
    row_bytes = 0 if out_on_device else 4 * int(ends.max(initial=0))
    desc_at, plan_at, in_bytes, miss_at, tally_at, out_bytes = tables_layout(n, n_tables, row_bytes)
    with device.lock:
        staged = device.pinned("keys", in_bytes)
        staged[: 8 * n].view(np.int64)[:] = keys
        staged[desc_at:plan_at].view(np.int64)[:] = desc.reshape(-1)
        staged[plan_at:].view(np.int64)[:] = plan.reshape(-1)
        dev_in = device.buffer("keys", staged.size)
        device.to_device(dev_in, staged)
        result = device.buffer("out", out_bytes)
        device.zero(result[tally_at:])
        args = (dev_in[desc_at:plan_at].view(np.int64), dev_in[plan_at:].view(np.int64),
                np.int32(n_tables), np.int64(warps.sum()), dev_in[: 8 * n].view(np.int64),
                out if out_on_device else result[:row_bytes].view(np.float32),
                result[miss_at:tally_at].view(np.int64),
                result[tally_at:].view(np.uint64))  # fmt: skip
        blocks = blocks_for(int(warps.sum()), device)
        device.launch("probe_gather_tables", blocks, THREADS, args)
        if not out_on_device:  # the rows straight into the caller's buffer
            flat = out.view(np.uint8)
            for a, b in _runs(out_offsets, ends):
                device.to_host(flat[4 * a : 4 * b], result[4 * a : 4 * b])
        back = device.pinned("out", out_bytes - miss_at)
        device.to_host(back, result[miss_at:])
        device.synchronize()
        tallies = back[tally_at - miss_at :].view(np.uint64).reshape(n_tables, 2).astype(np.int64)
        missed = tallies[:, 0].tolist()
        # all hits (the common case): no miss list to copy
        miss_pos = back[: 8 * n].view(np.int64).copy() if any(missed) else np.empty(n, np.int64)
    for first, n_miss in zip(lo.tolist(), missed, strict=True):
        if n_miss > 1:
            miss_pos[first : first + n_miss].sort()
    return tallies, miss_pos


def _runs(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """The tables' spans ``[starts[t], ends[t])`` merged into runs of adjacent tables: one
    copy each, so the gaps between them in the caller's buffer are left alone."""
    if (starts[1:] == ends[:-1]).all():  # tables in order, back to back (the pipeline's)
        return [(int(starts[0]), int(ends[-1]))]
    order = np.argsort(starts, kind="stable")
    first, stops = starts[order], ends[order]
    new = np.ones(first.size, dtype=bool)
    new[1:] = first[1:] != stops[:-1]
    runs = np.maximum.reduceat(stops, np.flatnonzero(new))
    return list(zip(first[new].tolist(), runs.tolist(), strict=True))

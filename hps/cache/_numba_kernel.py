"""The numba CPU kernel of :mod:`hps.cache.kernels` (imported only when numba is installed).

Three loops in one call, each a straight pass over the request:

1. the home group of every key (splitmix64, as :func:`hps.index.mix`);
2. the probes, with a software prefetch of the index groups a few keys ahead, so many cache
   misses are in flight at once (without it the probe ran at about half of a plain gather);
3. the copies into the output in request order, prefetching the rows a few keys ahead, with
   the L1 bookkeeping of each hit: last-access tick (and the distinct-hit count: a row whose
   tick already is this call's was hit before in it), access count up to its cap.

The copy dequantizes (:mod:`hps.rowformat`) as it goes, numba compiling one version per
arena dtype: float32 rows are copied as before; float16 rows (their bits, as ``uint16``)
are widened (``fpext``: the F16C / fcvt instruction where the CPU has one, else integer
code); int8 rows (``uint8``: ``dim`` codes, then the row's float32 scale and offset) become
``code * scale + offset``, rounded as NumPy rounds it (a product, then a sum: no fused
multiply-add), so the output equals :meth:`RowFormat.decode` bit for bit.

:func:`probe_gather_tables` runs it for every table of a request in one call, the caches
given by the addresses of their arrays, so a 26-table request crosses from Python once.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from typing import TypeVar

import numba
import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils, config
from numba.core.base import BaseContext
from numba.core.dispatcher import Dispatcher
from numba.core.typing.templates import Signature
from numba.extending import intrinsic, overload

from hps.cache.kernels import FORMAT_CODES
from hps.index import EMPTY, GROUP, TOMBSTONE

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., object])
# What an intrinsic's code generator is: (context, builder, signature, args) -> LLVM value
Codegen = Callable[[BaseContext, ir.IRBuilder, Signature, list[ir.Value]], ir.Value]
AHEAD = 12  # keys between a prefetch and its use


@intrinsic
def _prefetch(typingctx: object, arr: types.Array, idx: types.Integer) -> tuple[Signature, Codegen]:
    """``llvm.prefetch`` of ``arr[idx]`` (read, high locality): a hint, never a fault."""
    sig = types.void(arr, idx)

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


def _half_in_hardware() -> bool:
    """Whether LLVM turns a half-to-float ``fpext`` into one instruction for the target numba
    compiles for (x86 with F16C, ARM64); elsewhere it would call a runtime helper that the
    JIT cannot link."""
    cpu_name = getattr(config, "CPU_NAME", None)  # NUMBA_CPU_NAME (set when numba loads)
    if cpu_name and cpu_name != "host":
        return False  # a named (portable) target: no assumption about its features
    if platform.machine().lower() in ("arm64", "aarch64"):
        return True
    return "+f16c" in binding.get_host_cpu_features().flatten().split(",")


HALF_IN_HARDWARE = _half_in_hardware()


@intrinsic
def _half_bits_fpext(typingctx: object, bits: types.Integer) -> tuple[Signature, Codegen]:
    """float16 bits (uint16) to float32 with LLVM's ``fpext`` (one instruction with F16C)."""
    sig = types.float32(types.uint16)

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


def _bitcast(src: types.Type, dst: types.Type, llvm_dst: ir.Type) -> object:
    """An intrinsic reinterpreting a ``src`` value's bits as ``dst``."""

    @intrinsic
    def bitcast(typingctx: object, value: types.Type) -> tuple[Signature, Codegen]:
        def codegen(
            context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
        ) -> ir.Value:
            return builder.bitcast(args[0], llvm_dst)

        return dst(src), codegen

    return bitcast


_u32_as_f32 = _bitcast(types.uint32, types.float32, ir.FloatType())
_f32_as_u32 = _bitcast(types.float32, types.uint32, ir.IntType(32))


@numba.njit(inline="always")
def _half_bits_exact(h):  # float16 bits -> float32 in integer code: exact, NaN bits kept
    h = np.uint32(h)
    em = h & np.uint32(0x7FFF)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    bits = (em << np.uint32(13)) + np.uint32(112 << 23)  # exponent bias 15 -> 127
    if em >= np.uint32(0x7C00):  # inf, nan: the largest exponent stays the largest
        bits += np.uint32(112 << 23)
    elif em < np.uint32(0x0400):  # zero, subnormal: renormalised by a float subtraction
        bits = _f32_as_u32(
            _u32_as_f32(bits + np.uint32(1 << 23)) - _u32_as_f32(np.uint32(113 << 23))
        )
    return _u32_as_f32(bits | sign)


half_to_float = _half_bits_fpext if HALF_IN_HARDWARE else _half_bits_exact


@numba.njit(inline="always")
def _f32_at(flat, at):  # the float32 stored at byte ``at`` of a uint8 row (any alignment)
    a = np.uint64(at)
    bits = (
        np.uint32(flat[a])
        | (np.uint32(flat[a + np.uint64(1)]) << np.uint32(8))
        | (np.uint32(flat[a + np.uint64(2)]) << np.uint32(16))
        | (np.uint32(flat[a + np.uint64(3)]) << np.uint32(24))
    )
    return _u32_as_f32(bits)


def _copy_row(flat_values, src, flat_out, dst, dim):
    """Stored row at ``flat_values[src:]`` -> float32 ``flat_out[dst:dst + dim]`` (compiled
    per arena dtype by the overload below; never called from Python)."""


@overload(_copy_row, inline="always")
def _copy_row_for(flat_values, src, flat_out, dst, dim):
    kind = flat_values.dtype
    if kind == types.float32:

        def copy(flat_values, src, flat_out, dst, dim):
            for d in range(dim):
                flat_out[dst + np.uint64(d)] = flat_values[src + np.uint64(d)]

    elif kind == types.uint16:

        def copy(flat_values, src, flat_out, dst, dim):
            for d in range(dim):
                flat_out[dst + np.uint64(d)] = half_to_float(flat_values[src + np.uint64(d)])

    elif kind == types.uint8:

        def copy(flat_values, src, flat_out, dst, dim):
            scale = _f32_at(flat_values, src + np.uint64(dim))
            offset = _f32_at(flat_values, src + np.uint64(dim + 4))
            for d in range(dim):
                code = np.float32(flat_values[src + np.uint64(d)])
                flat_out[dst + np.uint64(d)] = code * scale + offset

    else:
        return None
    return copy


def _probe_gather(  # the signature is kernels.ProbeGather's
    slot_keys, slot_rows, gmask, values, keys, out, ticks, tick, counts, cap, miss_pos
):
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    umask = np.uint64(gmask)
    empty, tomb = np.int64(EMPTY), np.int64(TOMBSTONE)
    dim = out.shape[1]
    width = values.shape[1]  # stored elements per row: dim, or dim + 8 for int8
    udim, uwidth = np.uint64(dim), np.uint64(width)
    flat_values = values.reshape(-1)  # flat arrays and unsigned offsets: plain copy loops
    flat_out = out.reshape(-1)
    n = keys.shape[0]
    home = np.empty(n, dtype=np.int64)
    for i in range(n):
        x = np.uint64(keys[i])
        x = x ^ (x >> s30)
        x = x * m1
        x = x ^ (x >> s27)
        x = x * m2
        x = x ^ (x >> s31)
        home[i] = np.int64(x & umask)
    found = np.empty(n, dtype=np.int64)
    for i in range(n):
        if i + AHEAD < n:
            _prefetch(slot_keys, home[i + AHEAD] * GROUP)
            _prefetch(slot_rows, home[i + AHEAD] * GROUP)
        k = keys[i]
        row = -1
        if k > tomb:
            g = home[i]
            r = 1
            while True:
                base = g * GROUP
                ended = False
                for j in range(GROUP):
                    sk = slot_keys[base + j]
                    if sk == k:
                        row = int(slot_rows[base + j])
                        break
                    if sk == empty:
                        ended = True
                if row >= 0 or ended or r > gmask + 1:
                    break
                g = (g + r) & gmask
                r += 1
        found[i] = row
    n_miss = 0
    n_hit = 0
    for i in range(n):
        if i + AHEAD < n and found[i + AHEAD] >= 0:
            _prefetch(flat_values, found[i + AHEAD] * width)
            _prefetch(ticks, found[i + AHEAD])
        row = found[i]
        dst = np.uint64(i) * udim
        if row < 0:
            miss_pos[n_miss] = i
            n_miss += 1
            for d in range(dim):
                flat_out[dst + np.uint64(d)] = 0.0
        else:
            _copy_row(flat_values, np.uint64(row) * uwidth, flat_out, dst, dim)
            if ticks[row] != tick:
                ticks[row] = tick
                n_hit += 1
            if counts.shape[0]:
                c = counts[row] + 1
                counts[row] = c if c < cap else cap
    return n_miss, n_hit


def _pointer_to(nbtype: types.Type) -> object:
    """An intrinsic turning an address (int64) into a typed pointer for ``numba.carray``
    (callable from compiled code only)."""

    @intrinsic
    def as_pointer(typingctx: object, address: types.Integer) -> tuple[Signature, Codegen]:
        pointer = types.CPointer(nbtype)

        def codegen(
            context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
        ) -> ir.Value:
            return builder.inttoptr(args[0], context.get_value_type(pointer))

        return pointer(address), codegen

    return as_pointer


_i64p, _i32p, _f32p, _u16p, _u8p = (
    _pointer_to(t) for t in (types.int64, types.int32, types.float32, types.uint16, types.uint8)
)
FLOAT16, INT8 = FORMAT_CODES["float16"], FORMAT_CODES["int8"]  # else float32


@numba.njit(inline="always")
def _probe_table(desc, t, values, keys, out, miss_pos):
    """:func:`_probe_gather` of table ``t`` of the descriptors, its arena given typed."""
    slots, capacity = desc[t, 2], desc[t, 6]
    n_counts = capacity if desc[t, 9] != 0 else 0
    return probe_gather(
        numba.carray(_i64p(desc[t, 0]), slots),
        numba.carray(_i32p(desc[t, 1]), slots),
        desc[t, 3],
        values,
        keys,
        out,
        numba.carray(_i64p(desc[t, 7]), capacity),
        desc[t, 8],
        numba.carray(_i32p(desc[t, 9]), n_counts),
        desc[t, 10],
        miss_pos,
    )


def _probe_gather_tables(desc, bounds, keys, out, out_offsets, miss_pos, result):
    """:func:`_probe_gather` over the tables of one request in one call (the signature is
    kernels.ProbeGatherTables'). Row ``t`` of ``desc`` describes table ``t``'s cache by the
    addresses of its arrays (see :data:`hps.cache.kernels.DESCRIPTOR`); its keys are
    ``keys[bounds[t, 0]:bounds[t, 1]]``, its rows go to ``out`` from ``out_offsets[t]``, its
    miss positions to ``miss_pos`` from ``bounds[t, 0]`` and its counts to ``result[t]``.
    Tables of different row formats mix freely: each is read as its format's arena."""
    for t in range(desc.shape[0]):
        lo, hi = bounds[t, 0], bounds[t, 1]
        if hi == lo:
            continue
        dim, capacity, width, kind = desc[t, 5], desc[t, 6], desc[t, 11], desc[t, 12]
        table_keys, table_miss = keys[lo:hi], miss_pos[lo:hi]
        table_out = out[out_offsets[t] : out_offsets[t] + (hi - lo) * dim].reshape((hi - lo, dim))
        if kind == FLOAT16:
            values16 = numba.carray(_u16p(desc[t, 4]), (capacity, width))
            n_miss, n_hit = _probe_table(desc, t, values16, table_keys, table_out, table_miss)
        elif kind == INT8:
            values8 = numba.carray(_u8p(desc[t, 4]), (capacity, width))
            n_miss, n_hit = _probe_table(desc, t, values8, table_keys, table_out, table_miss)
        else:
            values32 = numba.carray(_f32p(desc[t, 4]), (capacity, width))
            n_miss, n_hit = _probe_table(desc, t, values32, table_keys, table_out, table_miss)
        result[t, 0] = n_miss
        result[t, 1] = n_hit


def _compile(fn: F) -> Dispatcher[F]:
    try:
        return numba.njit(cache=True, nogil=True, error_model="numpy")(fn)
    except RuntimeError as exc:  # no writable cache folder (a read-only install)
        log.warning("numba cannot cache the L1 kernel (%s); set NUMBA_CACHE_DIR", exc)
        return numba.njit(nogil=True, error_model="numpy")(fn)


probe_gather = _compile(_probe_gather)
probe_gather_tables = _compile(_probe_gather_tables)

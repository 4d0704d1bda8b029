"""L1 rows in the table's row format (docs: DESIGN.md, "Row formats and model versions").

The arena holds stored rows; ``insert`` / ``update`` / ``pin`` take them (any other dtype or
width is refused and changes nothing), ``dump`` gives them back unchanged, and ``query`` /
``query_into`` answer float32 rows equal to ``fmt.decode(stored)`` bit for bit, whether the
compiled kernel dequantized them as it gathered or the NumPy reference path decoded them.
The many-table kernel reads tables of different formats in one call.
"""

from __future__ import annotations

from types import ModuleType

import numba
import numpy as np
import pytest

from hps.cache import EmbeddingCache
from hps.cache import _numba_kernel as nk
from hps.cache.many import query_tables_into
from hps.errors import DTypeError, ShapeError
from hps.rowformat import FLOAT16_MAX, FORMATS, RowFormat

ALL_HALVES = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit, but any NaN for a NaN (hardware conversion may quiet one)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def awkward_rows(fmt: RowFormat, n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Stored rows with the values a format finds hardest: wide ranges, tiny magnitudes
    (float16 subnormals), the largest float16, signed zeros, constant rows (int8 scale 0)."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, dim)).astype(np.float32)
    rows[1::5] *= np.float32(1e-6)  # float16 subnormals
    rows[2::5] *= np.float32(3e3)
    rows[3::5] = -0.0 if fmt.name != "int8" else 7.25  # constant rows
    rows[4::5, 0] = FLOAT16_MAX
    rows[4::5, -1] = -FLOAT16_MAX
    return fmt.encode(rows)


def pair(fmt: RowFormat, dim: int, capacity: int, xp: ModuleType = np) -> list[EmbeddingCache]:
    """A cache on the compiled kernel and one on the NumPy reference path (``decode``)."""
    fast = EmbeddingCache(dim, capacity, xp=xp, fmt=fmt)
    ref = EmbeddingCache(dim, capacity, xp=xp, fmt=fmt)
    ref._kernel = None
    return [fast, ref]


@pytest.mark.parametrize("dim", [1, 3, 5, 8, 64, 67])
def test_lookups_equal_decode_of_the_stored_rows(xp: ModuleType, fmt: RowFormat, dim: int) -> None:
    keys = np.arange(100, 140, dtype=np.int64)
    stored = awkward_rows(fmt, keys.size, dim)
    request = np.array([139, 100, 5, 117, 117, 100, 2**40], dtype=np.int64)
    want = np.zeros((request.size, dim), np.float32)
    hit = np.isin(request, keys)
    want[hit] = fmt.decode(stored[request[hit] - 100], dim)
    for cache in pair(fmt, dim, 64, xp):
        assert cache.fmt is fmt and cache._rows.values.dtype == fmt.dtype
        cache.insert(keys, stored)
        out = np.full((request.size, dim), np.nan, np.float32)
        miss, n_hit = cache.query_into(request, out)
        same_bits(out, want)
        assert miss.tolist() == [2, 6] and n_hit == 3
        values, found = cache.query(np.unique(request))
        same_bits(values, want[np.unique(request, return_index=True)[1]])
        assert found.tolist() == [False, True, True, True, False]
        dumped_keys, dumped = cache.dump()
        assert dumped.dtype == fmt.dtype
        order = np.argsort(dumped_keys)
        np.testing.assert_array_equal(dumped[order], stored)  # the stored rows, unchanged


def test_every_float16_value_dequantizes_as_numpy_does(xp: ModuleType) -> None:
    fmt = FORMATS["float16"]
    stored = ALL_HALVES.reshape(256, 256)
    keys = np.arange(256, dtype=np.int64)
    for cache in pair(fmt, 256, 256, xp):
        cache.insert(keys, stored)
        out = np.empty((256, 256), np.float32)
        cache.query_into(keys, out)
        same_bits(out, fmt.decode(stored, 256))


def test_both_float16_conversions_of_the_cpu_kernel_are_exact() -> None:
    """The kernel widens with the CPU's instruction where it has one (``fpext``), else with
    integer code; both give NumPy's float32 for every float16 (NaN stays NaN)."""

    def widen(convert: object) -> np.ndarray:
        @numba.njit
        def run(bits: np.ndarray, out: np.ndarray) -> None:
            for i in range(bits.shape[0]):
                out[i] = convert(bits[i])  # type: ignore[operator]

        out = np.empty(ALL_HALVES.size, np.float32)
        run(ALL_HALVES.view(np.uint16), out)
        return out

    want = ALL_HALVES.astype(np.float32)
    same_bits(widen(nk._half_bits_exact), want)
    if nk.HALF_IN_HARDWARE:
        same_bits(widen(nk._half_bits_fpext), want)


def test_int8_rows_of_every_width_and_alignment() -> None:
    """int8's scale and offset sit at byte ``dim`` of the row: read at any alignment."""
    fmt = FORMATS["int8"]
    for dim in range(1, 13):
        stored = awkward_rows(fmt, 20, dim, seed=dim)
        keys = np.arange(20, dtype=np.int64)
        for cache in pair(fmt, dim, 32):
            cache.insert(keys, stored)
            out = np.empty((20, dim), np.float32)
            cache.query_into(keys[::-1].copy(), out)
            same_bits(out, fmt.decode(stored[::-1], dim))


@pytest.mark.parametrize("op", ["insert", "update", "pin"])
def test_rows_of_another_dtype_or_width_are_refused_and_change_nothing(
    xp: ModuleType, fmt: RowFormat, op: str
) -> None:
    dim = 4
    cache = EmbeddingCache(dim, 8, xp=xp, fmt=fmt)
    keys = np.array([1, 2], dtype=np.int64)
    cache.insert(keys, fmt.encode(np.ones((2, dim), np.float32)))
    before = (cache.dump(), cache.stats(), cache.version, cache.n_pinned)
    write = getattr(cache, op)
    others = [f for f in FORMATS.values() if f.dtype != fmt.dtype]
    for other in others:  # another format's stored rows (float32 rows into a quantized cache)
        with pytest.raises(DTypeError, match=f"stored as {fmt.dtype}"):
            write(keys, other.encode(np.full((2, dim), 2.0, np.float32)))
    with pytest.raises(DTypeError, match=f"stored as {fmt.dtype}"):
        write(keys, np.full((2, cache.width), 2.0, np.float64))
    for shape in ((2, cache.width + 1), (2, cache.width - 1), (3, cache.width), (cache.width,)):
        with pytest.raises(ShapeError, match=rf"expected {fmt.name} rows \(2, {cache.width}\)"):
            write(keys, np.full(shape, 2, fmt.dtype))
    after = (cache.dump(), cache.stats(), cache.version, cache.n_pinned)
    np.testing.assert_array_equal(after[0][0], before[0][0])
    np.testing.assert_array_equal(after[0][1], before[0][1])
    assert after[1:] == before[1:]


def test_pinned_rows_are_stored_rows(xp: ModuleType, fmt: RowFormat) -> None:
    cache = EmbeddingCache(3, 8, xp=xp, fmt=fmt, static_fraction=0.5)
    keys = np.array([4, 5], dtype=np.int64)
    stored = awkward_rows(fmt, 2, 3, seed=4)
    cache.pin(keys, stored)
    assert sorted(cache.pinned_keys().tolist()) == [4, 5]
    out = np.empty((2, 3), np.float32)
    cache.query_into(keys, out)
    same_bits(out, fmt.decode(stored, 3))


def test_the_many_table_call_reads_mixed_formats_in_one_call(xp: ModuleType) -> None:
    """On NumPy the CPU kernel; on CuPy (a GPU lent: ``make gpu-check``) one launch on the
    GPU's shared device; tiles of 8, 16 and 32 lanes."""
    dims = [4, 3, 7, 64, 5, 257]
    fmts = [FORMATS[n] for n in ("float32", "float16", "int8", "int8", "float16", "float32")]
    many = [EmbeddingCache(d, 64, xp=xp, fmt=f) for d, f in zip(dims, fmts, strict=True)]
    single = [EmbeddingCache(d, 64, xp=xp, fmt=f) for d, f in zip(dims, fmts, strict=True)]
    keys = np.arange(40, dtype=np.int64)
    stored = [
        awkward_rows(f, 40, d, seed=t) for t, (d, f) in enumerate(zip(dims, fmts, strict=True))
    ]
    for caches in (many, single):
        for cache, rows in zip(caches, stored, strict=True):
            cache.insert(keys, rows)
    rng = np.random.default_rng(1)
    segs = [rng.integers(0, 50, 30).astype(np.int64) for _ in dims]  # some misses (>= 40)
    sizes = np.array([s.size for s in segs])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    offsets = np.concatenate([[0], np.cumsum(sizes * dims)])
    out = np.full(int(offsets[-1]), np.nan, np.float32)
    bounds = np.stack([starts[:-1], starts[1:]], axis=1).astype(np.int64)
    got = query_tables_into(many, np.concatenate(segs), bounds, out, offsets[:-1])
    assert got is not None
    for t, (cache, seg) in enumerate(zip(single, segs, strict=True)):
        want = np.empty((seg.size, dims[t]), np.float32)
        miss, n_hit = cache.query_into(seg, want)
        same_bits(out[offsets[t] : offsets[t + 1]].reshape(seg.size, dims[t]), want)
        hit = seg < 40
        same_bits(want[hit], fmts[t].decode(stored[t][seg[hit]], dims[t]))
        assert got[t][0].tolist() == miss.tolist() == np.flatnonzero(~hit).tolist()
        assert got[t][1] == n_hit

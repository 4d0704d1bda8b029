"""The geometry of a ``multi_process_hash_map`` segment, from its ``volatile_db`` settings.

A segment's layout is a function of ``shared_memory_size`` and ``allocation_rate`` alone,
so it is decided here, below the layers that need it: the segment itself lays itself out
with :func:`segment_geometry` (:mod:`hps.storage._shm_layout`, which holds the rest of the
format), and ``hps plan`` and the start-up checks (:mod:`hps.topology`) read its fixed
cost and its number of table entries from the same function and constants.

Bytes of a segment::

    [0, PAGE)              header
    [PAGE, ...)            free-extent stack: int32 extent ids
    [tables_off, ...)      MAX_TABLES table entries of entry_bytes each
    [data_off, size)       n_ext extents of ``extent`` bytes: index buckets and row extents
"""

from __future__ import annotations

from dataclasses import dataclass

from hps.errors import ConfigError

PAGE = 4096
MIN_EXTENT = 64 * 1024
MAX_EXTENT = 16 * 1024 * 1024
MAX_TABLES = 256
"""Table entries of a segment: every table of every model version the node holds (served,
kept or being activated), and the update-version side tables of those whose versions are
kept in L2 (no L3), each takes one."""
ENTRY_META = 192  # bytes of int64 fields and the name at the start of a table entry


@dataclass(frozen=True)
class Geometry:
    size: int
    extent: int
    n_ext: int
    row_ext_cap: int
    dir_len: int
    free_off: int
    tables_off: int
    entry_bytes: int
    data_off: int  # the header, the free-extent stack and the table entries: fixed bytes


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def segment_geometry(size: int, allocation_rate: int) -> Geometry:
    """Lay out a segment of ``size`` bytes: ~1024 extents of 64 KiB .. 16 MiB each."""
    cap = max(MIN_EXTENT, min(MAX_EXTENT, _pow2_floor(allocation_rate)))
    extent = min(cap, max(MIN_EXTENT, _pow2_floor(size // 1024)))
    n0 = size // extent
    dir_len = max(64, 4 << (max(1, n0) - 1).bit_length())
    entry = _round_up(ENTRY_META + 4 * n0 + 4 * dir_len, 64)
    tables_off = _round_up(PAGE + 4 * n0, 64)
    data_off = _round_up(tables_off + MAX_TABLES * entry, PAGE)
    n_ext = (size - data_off) // extent if size > data_off else 0
    if n_ext < 4:
        raise ConfigError(
            f"volatile_db.shared_memory_size: {size} bytes is too small for the shared hash "
            f"map; need at least {data_off + 4 * extent} bytes"
        )
    return Geometry(size, extent, n_ext, n0, dir_len, PAGE, tables_off, entry, data_off)

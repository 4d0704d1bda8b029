"""The layout of the ``multi_process_hash_map`` segment: geometry, header words, table entries.

Bytes of a segment::

    [0, 4096)              header: int64 words, see ``HeaderWord``; from byte
                           DEPLOYMENT_TEXT, the deployment's L3 path (for messages)
    [FREE_OFF, ...)        free-extent stack: int32 extent ids
    [TABLES_OFF, ...)      MAX_TABLES table entries of ENTRY_BYTES each (see ``EntryView``)
    [DATA_OFF, SIZE)       N_EXT extents of EXTENT bytes: index buckets and row extents

The geometry (where each part starts, the extent size, ``MAX_TABLES``) is
:func:`hps.config.segment.segment_geometry` (``plan`` here), which ``hps plan`` and the
start-up checks read too.

A table entry holds int64 fields (``EntryWord``), the table's name (at byte 64), the ids of its row
extents (int32[ROW_EXT_CAP], at byte ENTRY_META) and its bucket directory (int32[DIR_LEN]).
The ``DIM`` word also records the table's row format (:mod:`hps.rowformat`): the dimension in
its low 32 bits, the format's code (:data:`FORMAT_CODES`) above them; a segment written before
formats were recorded has 0 there, float32.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

# the geometry, decided below the storage layer (re-exported: the segment's modules use it)
from hps.config.segment import ENTRY_META as ENTRY_META
from hps.config.segment import MAX_EXTENT as MAX_EXTENT
from hps.config.segment import MAX_TABLES as MAX_TABLES
from hps.config.segment import MIN_EXTENT as MIN_EXTENT
from hps.config.segment import PAGE as PAGE
from hps.config.segment import Geometry as Geometry
from hps.config.segment import segment_geometry
from hps.errors import ConfigError
from hps.rowformat import FORMATS, RowFormat

if TYPE_CHECKING:
    from hps.storage._shm_segment import Segment

MAGIC = 0x31504D5348535048  # b"HPSHSMP1", little-endian
VERSION = 1
NAME_BYTES = 128
DEPLOYMENT_TEXT = 1024  # byte of the header where the deployment's L3 path is kept
FORMAT_CODES = {"float32": 0, "float16": 1, "int8": 2}  # stored in DIM's high 32 bits
_FORMAT_SHIFT = 32
_DIM_MASK = (1 << _FORMAT_SHIFT) - 1

plan = segment_geometry
"""Lay out a segment of ``size`` bytes (:func:`hps.config.segment.segment_geometry`)."""


class HeaderWord(IntEnum):
    """Header words (int64)."""

    MAGIC = 0
    VERSION = 1
    SIZE = 2
    EXTENT = 3
    N_EXT = 4
    ROW_EXT_CAP = 5
    DIR_LEN = 6
    MAX_TABLES = 7
    FREE_OFF = 8
    TABLES_OFF = 9
    ENTRY_BYTES = 10
    DATA_OFF = 11
    READY = 12
    DIRTY = 13
    ATTACHED = 14
    TICK = 15
    FREE_TOP = 16
    COMMITTED = 17  # extents [0, COMMITTED) are backed by fallocate'd pages
    REPAIRS = 18
    CREATED = 19  # a random id drawn when the segment is initialised (0: older segments)
    FILLED = 20  # how many times a process finished filling this segment from L3
    DEPLOYMENT = 21  # a hash of the deployment's L3 path (0: none recorded; see Segment)
    DEPLOYMENT_LEN = 22  # bytes of that path kept from byte DEPLOYMENT_TEXT


class EntryWord(IntEnum):
    """Table entry words (int64); the name's bytes follow at byte 64."""

    STATE = 0  # 0 free; else in use, a number of this incarnation of the table (claim)
    DIM = 1  # dimension | format code << 32
    ROWS = 2
    ROWS_PER_EXT = 3
    N_ROW_EXT = 4
    N_BUCKETS = 5
    NAME_LEN = 6
    DIRTY = 7  # a writer is changing this table (see Segment.touch)


class NoSpace(Exception):
    """No free extent (internal: the store evicts and retries, or raises BackendError)."""


class NoMemory(NoSpace):
    """A free extent, but the folder of the segment (``/dev/shm``) cannot back it."""


def default_directory() -> str:
    """Where POSIX shared memory lives (``/dev/shm``), or the temp dir where there is none."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class EntryView:
    """Numpy views of one table entry: int64 fields, row-extent list, bucket directory."""

    def __init__(self, seg: Segment, slot: int) -> None:
        off = seg.tables_off + slot * seg.entry_bytes
        self.slot = slot
        self.meta = seg.i64[off // 8 : off // 8 + len(EntryWord)]
        r0 = (off + ENTRY_META) // 4
        self.row_ext = seg.i32[r0 : r0 + seg.row_ext_cap]
        self.dir = seg.i32[r0 + seg.row_ext_cap : r0 + seg.row_ext_cap + seg.dir_len]
        self._name = seg.u8[off + 64 : off + 64 + NAME_BYTES]

    @property
    def name(self) -> str:
        return bytes(self._name[: int(self.meta[EntryWord.NAME_LEN])]).decode()

    @property
    def dim(self) -> int:
        return int(self.meta[EntryWord.DIM]) & _DIM_MASK

    @property
    def fmt(self) -> RowFormat:
        """The format of the table's rows (code 0, float32, where none was recorded)."""
        code = int(self.meta[EntryWord.DIM]) >> _FORMAT_SHIFT
        names = {c: n for n, c in FORMAT_CODES.items()}
        if code not in names:
            raise ConfigError(f"table {self.name}: unknown row format code {code} in the segment")
        return FORMATS[names[code]]

    def claim(self, name: str, dim: int, fmt: RowFormat, rows_per_ext: int) -> None:
        raw = name.encode()
        self._name[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.meta[:] = 0
        self.meta[EntryWord.NAME_LEN] = len(raw)
        self.meta[EntryWord.DIM] = dim | FORMAT_CODES[fmt.name] << _FORMAT_SHIFT
        self.meta[EntryWord.ROWS_PER_EXT] = rows_per_ext
        self.dir[:] = -1
        # A handle of another process compares it with the one it opened: a table dropped
        # (and its entry claimed again, by it or another table) is then seen, not misread.
        self.meta[EntryWord.STATE] = 1 + secrets.randbits(62)

    def reset(self) -> None:
        """Forget every row (the caller rebuilds the free extents)."""
        self.meta[EntryWord.ROWS] = 0
        self.meta[EntryWord.N_ROW_EXT] = 0
        self.meta[EntryWord.N_BUCKETS] = 0
        self.dir[:] = -1
        self.meta[EntryWord.DIRTY] = 0

    def release(self) -> np.ndarray:
        """Free the entry (its name, format and rows); returns the extents it held, which the
        caller gives back to the segment."""
        held = self.extents()
        self.reset()
        self.meta[:] = 0
        return held

    def extents(self) -> np.ndarray:
        """Every extent this table holds: its row extents and its buckets."""
        rows = self.row_ext[: int(self.meta[EntryWord.N_ROW_EXT])]
        return np.concatenate([rows, np.unique(self.dir[self.dir >= 0])]).astype(np.int64)

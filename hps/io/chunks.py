"""How many rows one chunk of a pass over a whole table holds: a budget of bytes, not rows.

Every pass over a whole table a chunk at a time sizes its chunks here: an import reading
its files (:meth:`hps.io.table_files.TableFiles.chunks`, the loader's validation, load and
comparison with L3) and a backend's ``dump`` (``hps export``, the L2 fill from L3 at a
serving start, the key scans of warm-up). Such a pass holds a few copies of one chunk at
once (the rows as read, encoded, as the backend takes them), so its memory is a multiple
of a chunk's bytes: :func:`rows_per_chunk` keeps a chunk's rows within
:data:`CHUNK_BYTES` whatever the table's dimension, and within :data:`MAX_CHUNK_ROWS`
whatever its narrowness (per-row costs: keys, the Python objects of a RocksDB scan).
Rows of 128 bytes or fewer (float32 of dimension 32) get the most rows, 256k; a float32
row of dimension 1024, 8,192; of the largest dimension (65,536), 128.
"""

from __future__ import annotations

CHUNK_BYTES = 32 << 20  # bytes of rows one chunk of a whole-table pass holds (at most)
MAX_CHUNK_ROWS = 1 << 18  # rows one chunk holds, however narrow


def rows_per_chunk(row_bytes: int, budget: int | None = None) -> int:
    """Rows of ``row_bytes`` bytes each (a stored row, or a vector as read) one chunk holds:
    ``budget // row_bytes`` (default :data:`CHUNK_BYTES`; a pass beside other work passes a
    smaller one), at least 1 and at most ``MAX_CHUNK_ROWS``."""
    limit = CHUNK_BYTES if budget is None else budget
    return max(1, min(MAX_CHUNK_ROWS, limit // max(1, row_bytes)))

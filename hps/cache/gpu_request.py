"""A request's rows on the GPU, and the staging buffers a request grows.

When a request is answered on the GPU that holds L1 (:meth:`hps.lookup.LookupSession.
lookup_request` with ``on_gpu``: the CTR model, and the embedding model's ``KIND_GPU``
instances), L1's kernel writes its rows straight into a buffer on the device
(:func:`hps.cache.kernels_cupy.run_tables`), and two more launches finish the request there,
each one launch for every table (:mod:`hps.cache.cuda_request`):

- :func:`fill_rows`: the rows found below L1 (and those of tables without L1) go in with one
  copy and are scattered to their places;
- :func:`pool_rows`: the CTR model's sum-pooling per sample and table.

:func:`request_staging` is the one sizing rule of what a GPU's shared device then holds, for
both paths (rows back to the host, or kept on the device): ``hps plan`` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hps.cache.device import Device, Staging, staging_nbytes
from hps.cache.kernels_cupy import THREADS, blocks_for, pad, tables_layout
from hps.types import Array


class Fill(NamedTuple):
    """Rows found below L1 for one table of a request whose rows are on the device: the
    table's output starts at element ``offset`` of the request's buffer, holds ``n`` rows of
    ``dim``; ``rows[i]`` (host float32 ``[m, dim]``) goes to row ``positions[i]``."""

    offset: int
    n: int
    dim: int
    positions: np.ndarray
    rows: np.ndarray


def fill_nbytes(n_rows: int, n_elements: int) -> int:
    """Bytes of the ``fill`` staging for ``n_rows`` rows of ``n_elements`` floats in all:
    where each row goes in the request's buffer and where it starts in the rows (int64, one
    more: where the last ends), then the rows (16-byte aligned)."""
    return pad(8 * (2 * n_rows + 1)) + 4 * n_elements


def fill_rows(device: Device, out: Array, fills: Sequence[Fill]) -> None:
    """Write host rows into ``out``, a flat float32 buffer of ``device``: every table's rows
    and their places go in one pinned buffer and one copy, then one ``scatter_rows`` launch
    puts each row where it belongs. Returns once they are written."""
    fills = [f for f in fills if f.positions.size]
    if not fills:
        return
    with device.lock:
        counts = [f.positions.size for f in fills]
        n_rows = sum(counts)
        widths = np.repeat(np.array([f.dim for f in fills], dtype=np.int64), counts)
        ints = 8 * (2 * n_rows + 1)
        staged = device.pinned("fill", fill_nbytes(n_rows, int(widths.sum())))
        places = staged[:ints].view(np.int64)
        places[:n_rows] = np.concatenate([f.offset + f.positions * f.dim for f in fills])
        places[n_rows] = 0
        np.cumsum(widths, out=places[n_rows + 1 :])
        flat = staged[pad(ints) :].view(np.float32)
        e = 0
        for f in fills:
            flat[e : e + f.rows.size] = f.rows.reshape(-1)
            e += f.rows.size
        buf = device.buffer("fill", staged.size)
        device.to_device(buf, staged)
        args = (buf[: 8 * n_rows].view(np.int64), buf[8 * n_rows : ints].view(np.int64),
                np.int64(n_rows), buf[pad(ints) :].view(np.float32), out)  # fmt: skip
        device.launch("scatter_rows", blocks_for(n_rows, device), THREADS, args)
        device.synchronize()


def pool_nbytes(n_tables: int, batch: int) -> int:
    """Bytes of the ``pool`` staging: each table's (start, dim, column), then its CSR
    offsets (int64)."""
    return 8 * n_tables * (3 + batch + 1)


def pool_rows(
    device: Device, rows: Array, num_keys: np.ndarray, offsets: np.ndarray, dims: Sequence[int]
) -> Array:
    """Sum the rows of each sample within each table, on ``device``: ``rows`` is a request's
    flat float32 buffer there (table after table, ``num_keys[t]`` rows of ``dims[t]``),
    ``offsets`` (host) each table's CSR offsets ``[tables, batch + 1]``. Returns the pooled
    ``[batch, sum(dims)]`` on the device (allocated under its scope, whatever GPU is
    current), written by one ``pool_rows`` launch, as :func:`hps.ctr.network.pool_embeddings`
    pools on the host."""
    n_tables, batch = offsets.shape[0], offsets.shape[1] - 1
    dim = np.asarray(dims, dtype=np.int64)
    sizes = np.asarray(num_keys, dtype=np.int64) * dim
    tables = np.stack([np.cumsum(sizes) - sizes, dim, np.cumsum(dim) - dim], axis=1)
    width = int(dim.sum())
    with device.scope():
        out: Array = device.xp.empty((batch, width), dtype=np.float32)
    if batch == 0 or width == 0:
        return out
    with device.lock:
        staged = device.pinned("pool", pool_nbytes(n_tables, batch))
        ints = staged.view(np.int64)
        ints[: 3 * n_tables] = tables.reshape(-1)
        ints[3 * n_tables :] = np.asarray(offsets, dtype=np.int64).reshape(-1)
        buf = device.buffer("pool", staged.size)
        device.to_device(buf, staged)
        args = (buf[: 24 * n_tables].view(np.int64), buf[24 * n_tables :].view(np.int64),
                np.int64(n_tables), np.int64(batch), np.int64(width), rows, out)  # fmt: skip
        device.launch("pool_rows", blocks_for(n_tables * batch, device), THREADS, args)
        device.synchronize()
    return out


def request_staging(
    keys: Sequence[int],
    dims: Sequence[int],
    *,
    rows_on_device: bool = False,
    pooled_samples: int = 0,
) -> Staging:
    """The staging buffers a GPU's shared :class:`Device` holds once it ran requests of
    ``keys[t]`` keys for tables of dimension ``dims[t]`` (at most; one launch per request,
    :func:`hps.cache.kernels_cupy.run_tables`), grown to powers of two
    (:func:`hps.cache.device.staging_nbytes`): a pinned and a device buffer for the keys in;
    a device buffer for the results out (the rows, then the misses and tallies) and a
    pinned one for the misses and tallies; and the pinned response buffer the rows come back
    to (:meth:`hps.cache.device.Device.response`, the pipeline's host answers, one at a time
    as Triton schedules an instance's requests). ``hps plan`` prints it per Triton instance.

    ``rows_on_device`` (requests answered on the GPU): the results out are the misses and
    tallies alone, a pair of ``fill`` buffers carries the rows found below L1
    (:func:`fill_rows`; at most every row of a request: a cold start), and the request's
    rows themselves take ``device`` memory too (CuPy's pool keeps them between requests).
    ``pooled_samples`` (the CTR model's ``max_batch_size``): a pair of ``pool`` buffers
    (:func:`pool_rows`) and the pooled rows in device memory as well."""
    if not keys:
        return Staging(0, 0)
    n = sum(int(k) for k in keys)
    rows = 4 * sum(int(k) * int(d) for k, d in zip(keys, dims, strict=True))
    if not rows_on_device:
        layout = tables_layout(n, len(keys), rows)
        return staging_nbytes(
            pinned={"keys": layout.in_bytes, "out": layout.out_bytes - layout.miss_at,
                    "response": rows},
            device={"keys": layout.in_bytes, "out": layout.out_bytes},
        )  # fmt: skip
    layout = tables_layout(n, len(keys), 0)
    need = {"keys": layout.in_bytes, "out": layout.out_bytes, "fill": fill_nbytes(n, rows // 4)}
    pooled = 0
    if pooled_samples:
        need["pool"] = pool_nbytes(len(keys), pooled_samples)
        pooled = 4 * pooled_samples * sum(int(d) for d in dims)
    staged = staging_nbytes(pinned=need, device=need)
    return Staging(staged.pinned, staged.device + rows + pooled)

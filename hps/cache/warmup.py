"""Warm-up of L1: which keys to load before the first request, and loading them.

Sources, per table (``hps_cache`` keys; ``{model}`` and ``{table}`` in a path are replaced by
the model and table names, so one model can name one file per table):

- ``frequency_file``: the hottest keys of a frequency file. Format: a NumPy ``.npz`` archive
  with two equal-length 1-D arrays, ``keys`` (int64) and ``counts`` (any integer or float
  type, larger = hotter); :func:`write_frequency_file` writes one and ``hps freq`` builds one
  from an access log. With the ``frequency`` policy the hottest ``static_fraction x
  capacity`` keys become the pinned hot set.
- ``warmup_keyset``: a keyset file (seed 000's format: raw native-endian int64 keys, no
  separators), loaded after the frequency file's keys up to the capacity.
- neither: with ``init_ec`` (HugeCTR's switch) the first ``capacity`` keys of the table's
  sparse file (or of L3) when the whole table fits in L1, or when
  ``cache_refresh_percentage_per_iteration`` > 0 (HugeCTR's rule for initialising the cache
  from the sparse file). A cache at least as large as its table is thus pre-filled and
  answers every lookup from L1.

Vectors always come from L2/L3 through ``session.warm_up``, so L1 starts consistent with them.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hps.config import ModelConfig, PSConfig
from hps.errors import FormatError
from hps.io.keyset import read_keyset
from hps.types import Keys

log = logging.getLogger(__name__)

WARMUP_CHUNK = 1 << 16


def write_frequency_file(path: str | Path, keys: Any, counts: Any) -> None:
    """Write ``keys`` and their ``counts`` as a frequency file (``.npz``, exactly at ``path``)."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    counts = np.asarray(counts).reshape(-1)
    if keys.size != counts.size:
        raise FormatError(f"{path}: {keys.size} keys but {counts.size} counts")
    with open(path, "wb") as f:
        np.savez(f, keys=keys, counts=counts)


def read_frequency_file(path: str | Path) -> tuple[Keys, np.ndarray]:
    """``(keys, counts)`` of a frequency file; FormatError names what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if "keys" not in data or "counts" not in data:
                raise FormatError(f"{path}: a frequency file needs arrays 'keys' and 'counts'")
            keys, counts = data["keys"], data["counts"]
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a frequency file (.npz with keys, counts): {exc}") from None
    if keys.ndim != 1 or counts.shape != keys.shape:
        raise FormatError(f"{path}: keys {keys.shape} and counts {counts.shape} must be 1-D, equal")
    if keys.dtype.kind not in "iu" or counts.dtype.kind not in "iuf":
        raise FormatError(f"{path}: keys must be integers and counts numbers")
    return keys.astype(np.int64), counts


def count_access_log(path: str | Path, chunk_keys: int = 1 << 22) -> tuple[Keys, np.ndarray]:
    """Distinct keys of an access log (a keyset-format file with repeats) and their counts."""
    size = os.path.getsize(path)
    if size % 8:
        raise FormatError(f"{path}: {size} bytes is not a whole number of int64 keys")
    keys, counts = np.empty(0, np.int64), np.empty(0, np.int64)
    with open(path, "rb") as f:
        while chunk := f.read(chunk_keys * 8):
            k, c = np.unique(np.frombuffer(chunk, dtype=np.int64), return_counts=True)
            merged, inverse = np.unique(np.concatenate([keys, k]), return_inverse=True)
            total = np.zeros(merged.size, dtype=np.int64)
            np.add.at(total, inverse, np.concatenate([counts, c]))
            keys, counts = merged, total
    return keys, counts


def hottest(keys: Keys, counts: np.ndarray, k: int) -> Keys:
    """The ``k`` keys with the largest counts, hottest first."""
    if k <= 0 or keys.size == 0:
        return np.empty(0, dtype=np.int64)
    if k < keys.size:
        top = np.argpartition(-counts, k - 1)[:k]
        keys, counts = keys[top], counts[top]
    return keys[np.argsort(-counts, kind="stable")]


@dataclass(frozen=True)
class WarmUpPlan:
    """Keys to pin (the static hot set, hottest first) and keys to load as ordinary rows."""

    pinned: Keys
    rest: Keys

    @property
    def size(self) -> int:
        return int(self.pinned.size + self.rest.size)


def _path(template: str, model: str, table: str) -> str:
    return template.replace("{model}", model).replace("{table}", table)


def plan_warm_up(
    model: ModelConfig, index: int, capacity: int, table_keys: Keys | None = None
) -> WarmUpPlan:
    """What to load into table ``index``'s cache of ``capacity`` rows (see module docstring).

    ``table_keys`` are the table's own keys (at most ``capacity`` are needed), used when no
    frequency file or keyset is configured and ``init_ec`` asks for it.
    """
    cfg, spec = model.hps_cache, model.tables[index]
    empty = np.empty(0, dtype=np.int64)
    pinned, rest = empty, empty
    if cfg.frequency_file:
        keys, counts = read_frequency_file(_path(cfg.frequency_file, model.model, spec.table))
        top = hottest(keys, counts, capacity)
        n_pin = int(cfg.static_fraction * capacity) if cfg.policy == "frequency" else 0
        pinned, rest = top[:n_pin], top[n_pin:]
    if cfg.warmup_keyset:
        keys = read_keyset(_path(cfg.warmup_keyset, model.model, spec.table))
        keys = keys[~np.isin(keys, np.concatenate([pinned, rest]))]
        _, first = np.unique(keys, return_index=True)
        room = capacity - pinned.size - rest.size
        rest = np.concatenate([rest, keys[np.sort(first)][: max(0, room)]])
    if cfg.frequency_file or cfg.warmup_keyset or table_keys is None or not model.init_ec:
        return WarmUpPlan(pinned, rest)
    return WarmUpPlan(empty, np.unique(table_keys)[:capacity])


def prefill_wanted(model: ModelConfig, capacity: int, table_rows: int) -> bool:
    """Whether the table's own keys should fill the cache at start-up (``init_ec``)."""
    cfg = model.hps_cache
    if cfg.frequency_file or cfg.warmup_keyset or not model.init_ec or table_rows == 0:
        return False
    return capacity >= table_rows or model.cache_refresh_percentage_per_iteration > 0


def table_keys(model: ModelConfig, index: int, persistent: Any, n: int) -> Keys | None:
    """Up to ``n`` keys of a table: from its sparse file's ``key`` file, else L3's dump."""
    if model.sparse_files:
        key_file = Path(model.sparse_files[index]) / "key"
        if key_file.is_file():
            return np.fromfile(key_file, dtype=np.int64, count=n)
    dump = getattr(persistent, "dump", None)
    if dump is None:
        return None
    parts, got = [], 0
    for keys, _ in dump(model.tables[index].name):
        parts.append(keys[: n - got])
        got += parts[-1].size
        if got >= n:
            break
    return np.concatenate(parts) if parts else None


def _chunks(keys: Keys, size: int) -> Iterator[Keys]:
    for lo in range(0, keys.size, size):
        yield keys[lo : lo + size]


def warm_up_session(session: Any, config: PSConfig) -> dict[str, int]:
    """Warm every cached table of ``session`` as ``config`` says; returns rows loaded per table.

    Loads in slices of ``cache_refresh_percentage_per_iteration`` x capacity rows (or
    :data:`WARMUP_CHUNK` when that is 0), so start-up memory stays bounded.
    """
    from hps.io.sparse_model import table_rows

    loaded: dict[str, int] = {}
    for model in config.models:
        for index, spec in enumerate(model.tables):
            cache = session.caches.get(spec.name)
            if cache is None:
                continue
            capacity = cache.capacity
            keys = None
            if prefill_wanted(model, capacity, table_rows(model, index, session.persistent)):
                keys = table_keys(model, index, session.persistent, capacity)
            plan = plan_warm_up(model, index, capacity, keys)
            pct = model.cache_refresh_percentage_per_iteration
            chunk = max(1, math.ceil(pct * capacity)) if pct > 0 else WARMUP_CHUNK
            n = sum(session.warm_up(spec.name, c, pin=True) for c in _chunks(plan.pinned, chunk))
            n += sum(session.warm_up(spec.name, c) for c in _chunks(plan.rest, chunk))
            loaded[spec.name] = n
            log.info("L1 %s: warmed up %d of %d planned rows", spec.name, n, plan.size)
    return loaded


def warm_up_keysets(session: Any, model: str, files_json: str | None) -> dict[str, int]:
    """Load the keys of keyset files into L1, ``files_json`` naming one file per table.

    ``files_json`` is a JSON object ``{"<table>": "<keyset path>"}`` (the control plane's
    warm-up passes it as the ``hps_warmup_keysets`` model parameter); rows loaded per table.
    """
    import json

    loaded: dict[str, int] = {}
    if not files_json:
        return loaded
    for table, path in json.loads(files_json).items():
        name = f"{model}.{table}"
        keys = read_keyset(path)
        loaded[name] = sum(session.warm_up(name, c) for c in _chunks(keys, WARMUP_CHUNK))
        log.info("L1 %s: warmed up %d rows from %s", name, loaded[name], path)
    return loaded

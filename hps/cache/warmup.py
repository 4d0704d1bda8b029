"""Warm-up of L1: which keys to load before the first request, and loading them.

Sources, per table (``hps_cache`` keys; ``{model}`` and ``{table}`` in a path are replaced by
the model and table names, so one model can name one file per table):

- ``frequency_file``: the hottest keys of a frequency file. Format: a NumPy ``.npz`` archive
  with two equal-length 1-D arrays, ``keys`` (int64) and ``counts`` (any integer or float
  type, larger = hotter), see :mod:`hps.io.frequency`; ``hps freq`` builds one from an
  access log. With the ``frequency`` policy the hottest ``static_fraction x
  capacity`` keys become the pinned hot set (fewer where that would pin nearly every row:
  :func:`hps.cache.placement.pinned_rows`).
- ``warmup_keyset``: a keyset file (raw native-endian int64 keys, no separators, as
  HugeCTR's embedding training cache wrote them), loaded after the frequency file's keys up
  to the capacity: its first distinct keys, read in chunks and no further than that needs.
- neither: with ``init_ec`` (HugeCTR's switch) the first ``capacity`` keys of the table's
  sparse file (or of L3) when the whole table fits in L1, or when
  ``cache_refresh_percentage_per_iteration`` > 0 (HugeCTR's rule for initialising the cache
  from the sparse file). A cache at least as large as its table is thus pre-filled and
  answers every lookup from L1.

Vectors always come from L2/L3 through ``session.warm_up``, so L1 starts consistent with them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from hps.cache.placement import pinned_rows
from hps.config import ModelConfig
from hps.dedup import first_occurrences
from hps.errors import FormatError
from hps.io.frequency import read_frequency_file
from hps.io.keyset import first_keys
from hps.types import Keys

log = logging.getLogger(__name__)

WARMUP_CHUNK = 1 << 16


def hottest(keys: Keys, counts: np.ndarray, k: int) -> Keys:
    """The ``k`` keys with the largest counts, hottest first."""
    if k <= 0 or keys.size == 0:
        return np.empty(0, dtype=np.int64)
    if k < keys.size:
        top = np.argpartition(-counts, k - 1)[:k]
        keys, counts = keys[top], counts[top]
    return keys[np.argsort(-counts, kind="stable")]


def load_slices(keys: Keys, capacity: int, size: int) -> list[Keys]:
    """The slices (at most ``size`` keys each) in which to load ``keys``, hottest first and
    repeats allowed (a warm-up request's), into a cache of ``capacity`` rows: the first
    ``capacity`` distinct keys, the coldest slice first, so that the hottest are loaded
    last (the newest ticks) and no key of the request evicts a hotter one."""
    fit = first_occurrences(keys)[: max(0, capacity)]
    return [fit[lo : lo + size] for lo in range(0, fit.size, size)][::-1]


@dataclass(frozen=True)
class WarmUpPlan:
    """Keys to pin (the static hot set, hottest first) and keys to load as ordinary rows."""

    pinned: Keys
    rest: Keys

    @property
    def size(self) -> int:
        return int(self.pinned.size + self.rest.size)


def warmup_path(template: str, model: str, table: str) -> str:
    """A warm-up file setting with ``{model}`` and ``{table}`` replaced."""
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
        path = warmup_path(cfg.frequency_file, model.model, spec.table)
        try:
            keys, counts = read_frequency_file(path)
        except FormatError as exc:  # the message starts with the path
            raise FormatError(f"hps_cache.frequency_file {exc}") from None
        top = hottest(keys, counts, capacity)
        n_pin = pinned_rows(cfg.static_fraction, capacity) if cfg.policy == "frequency" else 0
        pinned, rest = top[:n_pin], top[n_pin:]
    if cfg.warmup_keyset:  # read no further than the room left needs
        more = first_keys(
            warmup_path(cfg.warmup_keyset, model.model, spec.table),
            capacity - pinned.size - rest.size,
            exclude=np.concatenate([pinned, rest]),
            setting="hps_cache.warmup_keyset",
        )
        rest = np.concatenate([rest, more])
    if cfg.frequency_file or cfg.warmup_keyset or table_keys is None or not model.init_ec:
        return WarmUpPlan(pinned, rest)
    return WarmUpPlan(empty, np.unique(table_keys)[:capacity])


def prefill_wanted(model: ModelConfig, capacity: int, table_rows: int) -> bool:
    """Whether the table's own keys should fill the cache at start-up (``init_ec``)."""
    cfg = model.hps_cache
    if cfg.frequency_file or cfg.warmup_keyset or not model.init_ec or table_rows == 0:
        return False
    return capacity >= table_rows or model.cache_refresh_percentage_per_iteration > 0

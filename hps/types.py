"""Small frozen value types shared across the package."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from hps.rowformat import FORMATS, RowDtype, RowFormat

Keys = npt.NDArray[np.int64]
Vectors = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]

Array: TypeAlias = npt.NDArray[Any]
"""An array of an array module ``xp`` (:mod:`hps.cache.xp`): a NumPy array, or a CuPy array,
which has the same interface for everything we use and no type stubs (to mypy it is this)."""
ArrayModule: TypeAlias = ModuleType
"""``numpy`` or ``cupy``: code written once against ``xp`` takes it as this."""

JSON: TypeAlias = dict[str, object]
"""A JSON object as we build or read it (a ps.json section, an API answer, a bench row)."""

MAX_VERSION = 2**31 - 1
"""The highest model version (Triton's are int64, Kafka's version tags uint32: this fits
both, and is plenty)."""

RESERVED_KEYS = (int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).min) + 1)
"""Key values the hash indexes use as slot markers; no table may hold them."""


@dataclass(frozen=True)
class TableSpec:
    """One embedding table of one model version, as the storage tiers see it.

    ``name`` is the table's namespace in every backend: ``<model>.<table>`` for version 1
    (a model imported before it had versions is its version 1), ``<model>.<table>@<n>``
    for version ``n`` > 1 (:mod:`hps.versions`). Table and model names cannot hold ``@``,
    so the versions of a table never share rows.
    """

    model: str
    table: str
    dim: int
    default_value: float = 0.0
    max_keys_per_request: int = 0  # 0: unlimited
    row_dtype: RowDtype = "float32"  # how every tier stores its rows (hps.rowformat)
    version: int = 1  # the model version whose rows these are

    @property
    def name(self) -> str:
        base = f"{self.model}.{self.table}"
        return base if self.version == 1 else f"{base}@{self.version}"

    @property
    def qualified(self) -> str:
        """``<model>.<table>`` whatever the version: the table's topic and update key."""
        return f"{self.model}.{self.table}"

    @property
    def fmt(self) -> RowFormat:
        """The table's row format: stored dtype and width, encode and decode."""
        return FORMATS[self.row_dtype]

    @property
    def width(self) -> int:
        """Stored elements per row (``dim`` but for int8's scale and offset)."""
        return self.fmt.width(self.dim)

    def default_vectors(self, n: int) -> Vectors:
        return np.full((n, self.dim), self.default_value, dtype=np.float32)

    @staticmethod
    def parse_name(name: str) -> tuple[str, str, int]:
        """``(model, table, version)`` of a :attr:`name`."""
        qualified, _, version = name.partition("@")
        model, _, table = qualified.partition(".")
        return model, table, int(version) if version else 1


@dataclass(frozen=True)
class UpdateBatch:
    """Decoded online updates for one table: upserts or deletes, with their version.

    ``values`` is ``None`` for deletes. ``version`` is monotonically increasing per producer;
    an update never overwrites a newer one.
    """

    table: str  # "<model>.<table>"
    keys: Keys
    values: Vectors | None
    version: int
    delete: bool = False
    extras: dict[str, str] = field(default_factory=dict)

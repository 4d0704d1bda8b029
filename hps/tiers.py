"""The L2 and L3 of one process: the object the session, the applier and the loader share.

Nothing else holds the stores: code that reads or writes below L1 goes through a
:class:`Tiers`, so the order of writes (L3 first, then L2) and the L2-to-L3 fallback are
decided here once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hps.config import PSConfig
from hps.errors import BackendUnavailable, CircuitOpenError
from hps.storage import AccessMode, EmbeddingStore, open_store
from hps.types import Keys, TableSpec, Vectors

log = logging.getLogger(__name__)

NOWHERE, IN_L2, IN_L3 = 0, 2, 3
"""Values of :attr:`Fetched.level`: where each key was found."""


@dataclass(frozen=True)
class Fetched:
    """Rows of a batch of keys from L2/L3: ``values[i]`` is valid where ``level[i] != 0``."""

    values: Vectors
    level: npt.NDArray[np.int8]

    @property
    def found(self) -> npt.NDArray[np.bool_]:
        return self.level != NOWHERE


@dataclass
class Tiers:
    """L2 (``volatile``) and L3 (``persistent``); either may be ``None`` (disabled)."""

    volatile: EmbeddingStore | None
    persistent: EmbeddingStore | None

    @classmethod
    def open(
        cls, config: PSConfig, *, l3_mode: AccessMode = "read_write", l2: bool = True
    ) -> Tiers:
        """The tiers ``config`` names; ``l3_mode``: how this process opens L3 (see Topology);
        ``l2=False`` leaves L2 closed (e.g. another process's in-process L2)."""
        volatile = open_store(config.volatile_db) if l2 else None
        return cls(volatile, open_store(config.persistent_db, l3_mode))

    @property
    def stores(self) -> list[EmbeddingStore]:
        return [s for s in (self.persistent, self.volatile) if s is not None]

    def open_tables(self, specs: Iterable[TableSpec]) -> None:
        for spec in specs:
            for store in self.stores:
                store.open_table(spec)

    def fetch(
        self, spec: TableSpec, keys: Keys, *, before_l3: Callable[[], None] | None = None
    ) -> Fetched:
        """L2, then L3 for what L2 missed. An L2 that cannot be reached counts as a miss.

        ``before_l3`` runs just before L3 is read, and only when some key has to be read
        there (e.g. :meth:`catch_up_once`: a secondary L3 catches up only when needed).
        """
        level = np.zeros(keys.size, dtype=np.int8)
        values: Vectors | None = None
        if self.volatile is not None and keys.size:
            try:
                values, found = self.volatile.fetch(spec.name, keys)
                level[found] = IN_L2
            except CircuitOpenError:
                pass  # L2 failed moments ago and is skipped for a while (hps.storage.breaker)
            except BackendUnavailable as exc:
                log.warning("L2 unavailable, reading L3: %s", exc)
        if values is None:
            values = np.empty((keys.size, spec.dim), dtype=np.float32)
        rest = np.flatnonzero(level == NOWHERE)
        if rest.size and self.persistent is not None:
            if before_l3 is not None:
                before_l3()
            v3, f3 = self.persistent.fetch(spec.name, keys[rest])
            hit = rest[f3]
            values[hit] = v3[f3]
            level[hit] = IN_L3
        return Fetched(values, level)

    def write(
        self, table: str, keys: Keys, values: Vectors, *, durable: bool = False, l2: bool = True
    ) -> None:
        """Upsert into L3 (synced when ``durable``), then into L2 unless ``l2`` is false."""
        if self.persistent is not None:
            self.persistent.insert(table, keys, values, durable=durable)
        if l2 and self.volatile is not None:
            self.volatile.insert(table, keys, values)

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        """Delete from L3 and L2."""
        if self.persistent is not None:
            self.persistent.remove(table, keys, durable=durable)
        if self.volatile is not None:
            self.volatile.remove(table, keys)

    def catch_up(self) -> None:
        """Let a secondary L3 replay what its writer wrote since (a no-op otherwise)."""
        if self.persistent is not None:
            self.persistent.catch_up()

    def catch_up_once(self) -> Callable[[], None]:
        """A ``before_l3`` hook that calls :meth:`catch_up` the first time it runs only.

        A secondary's catch-up re-reads the writer's WAL (tens to hundreds of ms): readers
        that must see recent writes pay it once per pass, and only when L2 did not answer.
        """
        done = False

        def once() -> None:
            nonlocal done
            if not done:
                self.catch_up()
                done = True

        return once

    def close(self) -> None:
        for store in self.stores:
            store.close()

"""Apply decoded update batches to L3 then L2, then tell the L1 listeners.

Ordering and idempotence: each key's last applied version is kept beside its data
(:mod:`hps.tiers.versions`; the applier writes through :meth:`hps.tiers.Tiers.versioned`).
A row is applied only when its version is >= the stored one, so an older update never
overwrites a newer one and replaying messages after a crash (at-least-once delivery)
rewrites the same values. Within one call, the rows of a key collapse
to the one with the highest version (the latest in stream order among equals). Rows at or
above their key bucket's watermark skip the per-key read, whatever partition they came from
(:mod:`hps.tiers.versions` says why that is sound).

Write order per table: data and per-key versions to the first tier (L3 when it takes the
table; on ``rocks_db`` one put per row carries both, :mod:`hps.tiers.versions`), data to
L2, then a synced write beside the watermarks (raised before the data), which also syncs
everything written before it. A crash before that sync leaves versions no newer than the
data, and a row whose stored version equals the update's is re-applied, so the replay
re-applies.
A failing tier raises :class:`hps.errors.BackendError`; the caller retries the same batch.

Row formats: updates travel as float32 (the wire format does not change); the applier
encodes each table's winning rows into its row format (``hps_row_dtype``) once, before any
tier sees them, and hands the listeners (a serving process's L1) those stored rows.
:func:`hps.updates.consumer.decode_message` has already refused (dead-lettered) a message
whose values the table's format cannot hold.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hps.dedup import stored_rank
from hps.errors import BackendError, UnknownTableError
from hps.rowformat import Stored
from hps.tiers import Tiers, VersionedRows, encode_rows
from hps.types import Keys, TableSpec, UpdateBatch, Vectors
from hps.updates.metrics import PrometheusRecorder, Recorder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """What one table's part of a batch changed."""

    table: str
    keys: Keys  # upserted keys
    values: Stored  # their new rows, in the table's stored form (hps.rowformat)
    deleted: Keys
    stale: int  # rows dropped because a newer version was already applied
    published_ns: tuple[int, ...] = ()  # publish timestamps of the messages it came from


Listener = Callable[[Sequence[Applied]], None]
"""Called once per :meth:`Applier.apply` with what each table's part changed, after every
tier holds them and before they are synced. A :class:`hps.errors.BackendError` it raises
fails the batch (applied again: idempotent); any other error is logged."""


def model_filter(patterns: Iterable[str]) -> Callable[[str], bool]:
    """``update_filters``: a model's updates apply when any regex *searches* its name."""
    compiled = [re.compile(p) for p in patterns]
    return lambda model: any(c.search(model) for c in compiled)


class Applier:
    """Applies :class:`hps.types.UpdateBatch` lists to the tiers of the configured tables.

    ``persistent_models`` / ``volatile_models`` decide per model which tiers take its updates
    (ps.json's ``update_filters``); a tier that is ``None`` in ``tiers`` takes none.
    Tables beyond ``tables`` (other versions of a model: :mod:`hps.updates.routing`) are
    taken once :meth:`accept` has seen them; their tiers are opened at their first apply.
    """

    def __init__(
        self,
        tables: Mapping[str, TableSpec],
        tiers: Tiers,
        *,
        volatile_models: Callable[[str], bool] = lambda m: True,
        persistent_models: Callable[[str], bool] = lambda m: True,
        listeners: Sequence[Listener] = (),
        recorder: Recorder | None = None,
    ) -> None:
        self.listeners = list(listeners)
        self.recorder = recorder or PrometheusRecorder()  # l3_write, l2_write, sync stages
        self._tiers = tiers
        self._volatile_models = volatile_models
        self._persistent_models = persistent_models
        self._routes: dict[str, VersionedRows] = {}
        self._later: dict[str, TableSpec] = {}  # accepted, opened at their first apply
        self._first: dict[str, str] = {}  # table -> the stage its first tier's write times
        for spec in tables.values():
            self._open(spec)

    def _takes(self, spec: TableSpec) -> tuple[bool, bool]:
        """Whether L2 and L3 take ``spec``'s updates."""
        return (
            self._tiers.volatile is not None and self._volatile_models(spec.model),
            self._tiers.persistent is not None and self._persistent_models(spec.model),
        )

    def takes(self, spec: TableSpec) -> bool:
        """Whether some tier takes ``spec``'s updates (nothing is opened)."""
        return any(self._takes(spec))

    def forget(self, models: set[str]) -> list[str]:
        """Drop the tables of ``models`` (removed from the node: their rows may be dropped
        by a purge); the tables dropped. A later table of theirs is accepted again."""
        gone = [n for n, r in self._routes.items() if r.spec.model in models]
        gone += [n for n, s in self._later.items() if s.model in models]
        for name in gone:
            self._routes.pop(name, None)
            self._later.pop(name, None)
            self._first.pop(name, None)
        return gone

    def drop(self, names: Sequence[str]) -> list[str]:
        """Drop the tables ``names`` in this applier's tiers (rows, per-key versions,
        watermarks) and forget them; the ones it held."""
        dropped = []
        for name in names:
            route = self._routes.get(name)
            spec = route.spec if route is not None else self._later.get(name)
            if spec is None:
                continue
            self._tiers.drop_table(spec, reopen=False)  # a failure keeps it held: to retry
            self._routes.pop(name, None)
            self._later.pop(name, None)
            self._first.pop(name, None)
            dropped.append(name)
        return dropped

    def _open(self, spec: TableSpec) -> VersionedRows | None:
        l2, l3 = self._takes(spec)
        route = self._tiers.versioned(spec, l2=l2, l3=l3)
        if route is not None:
            self._routes[spec.name] = route
            first_is_l3 = route.tiers[0] is self._tiers.persistent
            self._first[spec.name] = "l3_write" if first_is_l3 else "l2_write"
        return route

    def accept(self, spec: TableSpec) -> bool:
        """Whether some tier takes ``spec``'s updates (a table of any version); one this
        applier was not built with is opened in its tiers at its first apply."""
        if spec.name in self._routes or spec.name in self._later:
            return True
        if not self.takes(spec):
            return False
        self._later[spec.name] = spec
        return True

    @property
    def tables(self) -> dict[str, TableSpec]:
        """The tables whose updates this applier writes somewhere."""
        return {name: r.spec for name, r in self._routes.items()}

    def apply(
        self, batches: Sequence[UpdateBatch], served: Callable[[], None] | None = None
    ) -> list[Applied]:
        """Apply ``batches`` (in stream order); raise BackendError if a tier fails.

        In three steps: every table's rows are written to its tiers (L3 unsynced); the
        listeners refresh L1 and ``served()`` is called (the rows are served from then
        on); then each table's synced watermark write makes the batch durable. Serving
        before the sync loses nothing: until the sync returns, the offsets are not
        committed, so a crash or a failed sync has the batch applied again.
        """
        by_table: dict[str, list[UpdateBatch]] = {}
        for b in batches:
            if b.keys.size:
                by_table.setdefault(b.table, []).append(b)
        done: list[Applied] = []
        syncs: list[Callable[[], None]] = []
        for table, group in by_table.items():
            route = self._routes.get(table)
            if route is None and table in self._later:
                route = self._open(self._later[table])  # BackendError: the batch is retried
                del self._later[table]
            if route is None:
                raise UnknownTableError(f"no tier takes updates of table {table!r}")
            applied, sync = self._apply_table(route, group)
            done.append(applied)
            syncs.append(sync)
        for listener in self.listeners:
            try:
                listener(done)
            except BackendError:  # e.g. the node's journal: the batch is applied again
                raise
            except Exception:  # L1 upkeep must not fail a batch L2/L3 already hold
                log.exception("update listener failed for %s", [a.table for a in done])
        if served is not None:
            served()
        for sync in syncs:
            sync()
        return done

    def _apply_table(
        self, route: VersionedRows, group: list[UpdateBatch]
    ) -> tuple[Applied, Callable[[], None]]:
        """Write one table's rows (L3 unsynced); returns them and the synced watermark write."""
        spec = route.spec
        keys, versions, deletes, values, parts = _latest_per_key(group, spec.dim)
        slow = ~route.fast(keys, versions)  # below their bucket's watermark (hps.tiers.versions)
        stored = np.zeros(keys.size, dtype=np.uint64)
        if slow.any():
            stored[slow] = route.stored(keys[slow])
        keep = versions >= stored
        up = keep & ~deletes
        rm = keep & deletes
        up_keys, rm_keys = keys[up], keys[rm]
        up_values = encode_rows(spec, values[up])  # once, for every tier and the listeners
        # Without a partition there is no watermark write to sync the batch: sync the data.
        sync = bool(keep.any()) and not bool((parts[keep] >= 0).any())
        # the first tier takes data and versions together, then the others the data
        marks = [time.perf_counter()]
        route.write(
            (up_keys, up_values, versions[up]),
            (rm_keys, versions[rm]),
            durable=sync,
            first_done=lambda: marks.append(time.perf_counter()),
        )
        marks.append(time.perf_counter())
        self._timed(spec.name, len(route.tiers), marks)
        kept_keys, kept_versions = keys[keep], versions[keep]

        def synced() -> None:
            start = time.perf_counter()
            route.watermarks.advance(kept_keys, kept_versions, durable=True)
            self.recorder.stage("sync", time.perf_counter() - start)

        published = tuple(int(p) for b in group if (p := b.extras.get("published_ns")) is not None)
        applied = Applied(spec.name, up_keys, up_values, rm_keys, int((~keep).sum()), published)
        return applied, synced

    def _timed(self, table: str, tiers: int, marks: list[float]) -> None:
        """Stage timing of one table's write: [start, first tier done, all tiers done]."""
        start, first, done = marks
        self.recorder.stage(self._first[table], first - start)
        if tiers > 1:
            self.recorder.stage("l2_write", done - first)


def _latest_per_key(
    group: list[UpdateBatch], dim: int
) -> tuple[Keys, np.ndarray, np.ndarray, Vectors, np.ndarray]:
    """Concatenate a table's batches and keep, per key, the highest version (latest in order).

    Returns keys, versions, delete flags, vectors and the partition of each row, in the
    stored key order (:mod:`hps.dedup`), so the L3 write finds them ordered.
    """
    keys = np.concatenate([b.keys for b in group]).astype(np.int64, copy=False)
    sizes = [b.keys.size for b in group]
    versions = np.repeat(np.array([b.version for b in group], dtype=np.uint64), sizes)
    deletes = np.repeat(np.array([b.delete for b in group], dtype=bool), sizes)
    parts = np.repeat(
        np.array([int(b.extras.get("partition", -1)) for b in group], dtype=np.int64), sizes
    )
    values = np.concatenate(
        [np.zeros((b.keys.size, dim), np.float32) if b.values is None else b.values for b in group]
    )
    rank = stored_rank(keys)
    order = np.argsort(rank)  # unstable: only the rows of a repeated key need more care
    ranked = rank[order]
    repeat = ranked[1:] == ranked[:-1]
    if repeat.any():  # each repeated key keeps its highest version, the latest among equals
        tied = np.zeros(keys.size, dtype=bool)  # positions in `order` of a repeated key's rows
        tied[1:] |= repeat
        tied[:-1] |= repeat
        at = np.flatnonzero(tied)
        rows = order[at]
        by = np.lexsort((rows, versions[rows], ranked[at]))  # the few tied rows only
        tail = ranked[at][by]
        last = np.ones(by.size, dtype=bool)
        last[:-1] = tail[1:] != tail[:-1]
        keep = ~tied
        keep[at[by[last]]] = True  # the winner's position: its group shares one rank
        order = order[keep]
    return keys[order], versions[order], deletes[order], values[order], parts[order]

"""Tiers: the L2 and L3 of one process, the one way below L1.

The session, the applier, the loader, the control plane and the load test all reach rows
below L1 through a :class:`Tiers`: the order of writes (L2's copies dropped, L3, then L2:
:meth:`Tiers.write`), the L2-to-L3 fallback, the backfill of L3 hits into L2 (only keys L2
lacks: ``insert_absent``, and none this process wrote to or removed from L2 since the
lookup's read: :mod:`hps.tiers.l2_writes`), where update versions live and how rows move
from L3 to L2 are decided here once. A secondary L3 is caught up before a read when its
last catch-up is older than :data:`SECONDARY_LAG_S`.
Each tier is a :class:`hps.tiers.rows.RowStore`.

L3 rows in damaged blocks (:class:`hps.errors.DamagedRowsError`) are answered as not found
(L2's copy if it has one, else the table's default vector), logged at most every
:data:`hps.throttle.INTERVAL_S` per table and counted in :attr:`Tiers.damaged_keys`; the
other keys of the batch are served. An L2 that cannot be reached counts as a miss; so does
one that refuses a read (credentials rotated, a permission taken away) while there is an L3
holding every row: logged at most every :data:`hps.throttle.INTERVAL_S` per table, counted
in :attr:`Tiers.l2_read_errors`. A fill of L2 from L3 that fails raises
:class:`hps.errors.FillError`, saying how many rows it had copied.

Every row here is a table's stored row (``spec.fmt``'s form, :mod:`hps.rowformat`): reads
return them and writes take them; they move from L3 to L2 as they are. Encoding float32
(imports, updates, control-plane writes) and decoding (lookups) happen at the edges.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hps.config import PSConfig
from hps.errors import (
    AccessRefused,
    BackendError,
    BackendUnavailable,
    CircuitOpenError,
    ConfigError,
    DamagedRowsError,
    FillError,
    HPSError,
    InvalidValueError,
)
from hps.rowformat import Stored
from hps.storage import AccessMode, EmbeddingStore
from hps.throttle import Throttled
from hps.tiers.l2_writes import GuardedRows, L2Writes, writes_of
from hps.tiers.rows import Level, RowStore
from hps.tiers.side_tables import Versions, side_table
from hps.tiers.versions import VERSION_SUFFIX, VersionedRows, key_versions, last_version
from hps.tiers.watermarks import WATERMARK_SUFFIX
from hps.types import Keys, TableSpec, Vectors

log = logging.getLogger(__name__)

NOWHERE, IN_L2, IN_L3 = 0, 2, 3
"""Values of :attr:`Fetched.level`: where each key was found."""

SECONDARY_LAG_S = 0.05
"""A read that falls through to a secondary L3 first lets it catch up with its writer when
its last catch-up is older than this: how stale an L3 row can be when an update's key has
left L2 (evicted) and the serving process reads it below."""


@dataclass(frozen=True)
class TableCheck:
    """:meth:`Tiers.verify_l3`'s verdict on one column family of L3."""

    name: str  # ``<model>.<table>``, or ``default`` (the tables' recorded formats)
    rows: int  # rows read (before the damage, when damaged)
    problem: str | None  # None: every block's checksum (and every row's length) is right

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Fetched:
    """Stored rows of a batch of keys from L2/L3 (``(n, spec.width)`` of ``spec.fmt.dtype``):
    ``values[i]`` is valid where ``level[i] != 0``. ``unread`` marks keys not found because
    no tier could say: L2 unreachable and no L3, or the key's L3 block damaged (a key not
    found and not unread is absent from every tier)."""

    values: Stored
    level: npt.NDArray[np.int8]
    unread: npt.NDArray[np.bool_]

    @property
    def found(self) -> npt.NDArray[np.bool_]:
        return self.level != NOWHERE


def encode_rows(spec: TableSpec, values: Vectors) -> Stored:
    """Validated float32 rows (``hps.validate.as_rows``) in ``spec``'s stored form: what every
    edge that writes rows calls. A value the format cannot hold (beyond float16's range) is
    an :class:`hps.errors.InvalidValueError` naming the table. float32: ``values`` itself."""
    try:
        return spec.fmt.encode(values)
    except InvalidValueError as exc:
        raise InvalidValueError(f"{spec.name}: {exc}") from None


def check_encodable(spec: TableSpec, values: Vectors) -> None:
    """Raise the InvalidValueError :func:`encode_rows` would raise for finite ``values``,
    without encoding them (:meth:`hps.rowformat.RowFormat.check`: float16's range, int8's
    row span). What validates a batch before anything is written (imports, updates)."""
    try:
        spec.fmt.check(values)
    except InvalidValueError as exc:
        raise InvalidValueError(f"{spec.name}: {exc}") from None


def _tier(store: EmbeddingStore | RowStore | None, level: Level) -> RowStore | None:
    if store is None or isinstance(store, RowStore):
        return store
    return RowStore(store, level)


class Tiers:
    """L2 (``volatile``) and L3 (``persistent``), each a :class:`RowStore` or ``None``.

    Built from open stores (tests pass in-memory ones) or by :meth:`open` from a ps.json.
    """

    def __init__(
        self,
        volatile: EmbeddingStore | RowStore | None,
        persistent: EmbeddingStore | RowStore | None,
    ) -> None:
        self.volatile = _tier(volatile, "L2")
        self.persistent = _tier(persistent, "L3")
        self.damaged_keys = 0  # keys L3 could not read (damaged blocks), answered not found
        self.l2_read_errors = 0  # L2 reads refused (not unreachable), answered from L3
        self._damage_logged = Throttled(log, logging.ERROR)
        self._refused = Throttled(log, logging.ERROR)
        self._l2_behind = Throttled(log, logging.WARNING)
        self._caught_up_at = -math.inf
        self._catching_up = threading.Lock()

    @classmethod
    def open(
        cls, config: PSConfig, *, l3_mode: AccessMode = "read_write", l2: bool = True
    ) -> Tiers:
        """The tiers ``config`` names; ``l3_mode``: how this process opens L3 (see Topology);
        ``l2=False`` leaves L2 closed (e.g. another process's in-process L2)."""
        volatile = RowStore.open(config.volatile_db, "L2") if l2 else None
        return cls(volatile, RowStore.open(config.persistent_db, "L3", l3_mode))

    def subset(self, *, l2: bool = True, l3: bool = True) -> Tiers:
        """A view of these tiers without L2 (``l2=False``) or L3; the stores stay shared
        (closing is the owner's)."""
        return Tiers(self.volatile if l2 else None, self.persistent if l3 else None)

    @property
    def stores(self) -> list[RowStore]:
        """The open tiers, L3 first."""
        return [s for s in (self.persistent, self.volatile) if s is not None]

    @property
    def primary(self) -> RowStore | None:
        """The tier that holds a table's whole copy and its update versions: L3, else L2."""
        return self.persistent if self.persistent is not None else self.volatile

    def open_tables(self, specs: Iterable[TableSpec], *, replace: bool = False) -> None:
        """Declare ``specs`` in every tier. A tier that holds a table's rows in another
        format or dimension refuses it (:class:`hps.errors.ConfigError`, naming
        ``hps import --force``); with ``replace`` the table is then dropped in every tier
        and created anew in its configured format (``hps import --force``)."""
        specs = list(specs)
        try:
            for store in self.stores:
                store.open_tables(specs)
            return
        except ConfigError:
            if not replace:
                raise
        for spec in specs:  # again one by one, dropping those refused
            try:
                for store in self.stores:
                    store.open_table(spec)
            except ConfigError as exc:
                if not replace:
                    raise
                log.warning("%s; dropping it in every tier to import it again", exc)
                self.drop_table(spec)

    def drop_table(self, spec: TableSpec, *, reopen: bool = True) -> None:
        """Delete a table's rows and recorded format in every tier, then (``reopen``) declare
        it anew. Its per-key update versions and watermarks go with it."""
        for store in self.stores:
            store.drop_table(spec.name)
            for suffix in (VERSION_SUFFIX, WATERMARK_SUFFIX):
                store.drop_table(side_table(spec, suffix).name)
        if reopen:
            for store in self.stores:
                store.open_table(spec)

    # -- reads --------------------------------------------------------------------------------

    def fetch(
        self, spec: TableSpec, keys: Keys, *, before_l3: Callable[[], None] | None = None
    ) -> Fetched:
        """L2, then L3 for what L2 missed. An L2 that cannot be reached counts as a miss, and
        so does one that refuses the read where there is an L3 (else the error is raised).

        ``before_l3`` runs just before L3 is read, and only when some key has to be read
        there (e.g. :meth:`catch_up_once`: a secondary L3 catches up only when needed);
        without it a secondary catches up when it last did more than
        :data:`SECONDARY_LAG_S` ago.
        """
        level = np.zeros(keys.size, dtype=np.int8)
        unread = np.zeros(keys.size, dtype=bool)
        values: Stored | None = None
        l2_answered = False
        if self.volatile is not None and keys.size:
            try:
                values, found = self.volatile.fetch(spec.name, keys)
                l2_answered = True
                level[found] = IN_L2
                if not values.flags.writeable:  # L3's hits and callers' defaults go into it
                    values = values.copy()
            except CircuitOpenError:
                pass  # L2 failed moments ago and is skipped for a while (hps.storage.breaker)
            except BackendUnavailable as exc:
                log.warning("L2 unavailable, reading L3: %s", exc)
            except AccessRefused as exc:  # credentials rotated, a permission taken away
                if self.persistent is None:
                    raise
                self.l2_read_errors += 1
                self._refused(spec.name, "L2 refused a read of %s, reading L3: %s",
                              spec.name, exc)  # fmt: skip
        if values is None:
            values = spec.fmt.empty(keys.size, spec.dim)
        rest = np.flatnonzero(level == NOWHERE)
        if rest.size and self.persistent is not None:
            if before_l3 is not None:
                before_l3()
            elif time.monotonic() - self._caught_up_at >= SECONDARY_LAG_S:
                self.catch_up_if_stale()
            try:
                v3, f3 = self.persistent.fetch(spec.name, keys[rest])
            except DamagedRowsError as exc:  # the other keys were read: serve them
                v3, f3 = exc.values, exc.found
                unread[rest[exc.damaged]] = True
                self._damaged(spec.name, int(exc.damaged.sum()), exc)
            hit = rest[f3]
            values[hit] = v3[f3]
            level[hit] = IN_L3
        elif rest.size and self.volatile is not None and not l2_answered:
            unread[rest] = True
        return Fetched(values, level, unread)

    def _damaged(self, table: str, count: int, exc: DamagedRowsError) -> None:
        """Count keys L3 could not read and log them (throttled per table)."""
        self.damaged_keys += count
        self._damage_logged(table, "%s; answered as not found", exc, count=count)

    def verify_l3(self, tables: list[str] | None = None) -> list[TableCheck]:
        """Every column family of L3 (or those of ``tables`` it holds) read with checksums
        verified (``hps verify``, ``hps import --force``); none without a RocksDB L3."""
        from hps.storage.rocks_db import RocksDBStore

        store = self.persistent.backend_store if self.persistent is not None else None
        if not isinstance(store, RocksDBStore):
            return []
        names = store.column_families
        if tables is not None:
            names = [n for n in names if n in set(tables)]
        return [TableCheck(name, *store.verify(name)) for name in names]

    def dump(self, table: str) -> Iterator[tuple[Keys, Stored]]:
        """Every stored row of a table, from the tier that holds its whole copy (L3, else L2)."""
        if self.primary is not None:
            yield from self.primary.dump(table)

    def stored_versions(self, spec: TableSpec, keys: Keys) -> Versions:
        """The version of each key's last applied update (0: never), where versions live."""
        if self.primary is None:
            return np.zeros(keys.size, dtype=np.uint64)
        return key_versions(self.primary, spec).get(keys)

    def last_version(self, spec: TableSpec) -> int | None:
        """The highest update version applied to a table (None: none, or no tier)."""
        return None if self.primary is None else last_version(self.primary, spec)

    # -- writes -------------------------------------------------------------------------------

    def write(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        """Upsert stored rows into L3 (synced when ``durable``) and L2.

        With both tiers, L2 drops its copies of the keys first: an L2 that fails then has
        nothing written anywhere (the error is raised), and one that fails after L3 took
        the rows lacks them, so reads find them in L3 (a warning, no error: the write
        happened). L3 first, then L2, as without the drop, would leave L2's older rows served
        after a failure between the two. The keys are held in :attr:`l2_writes` throughout."""
        with self._l2_writing(table, keys):
            self._drop_l2_copies(table, keys)
            if self.persistent is not None:
                self.persistent.insert(table, keys, values, durable=durable)
            if self.volatile is not None:
                self._l2_after_l3(self.volatile.insert, table, keys, values)

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        """Delete from L2 and L3, L2 dropping its copies first as in :meth:`write`, and
        again after L3 (a read between the two may have copied L3's row back into it). The
        keys are held in :attr:`l2_writes` throughout."""
        with self._l2_writing(table, keys):
            self._drop_l2_copies(table, keys)
            if self.persistent is not None:
                self.persistent.remove(table, keys, durable=durable)
            if self.volatile is not None:
                self._l2_after_l3(self.volatile.remove, table, keys)

    def _drop_l2_copies(self, table: str, keys: Keys) -> None:
        """Before a write to L3 where there is an L2 too: remove the keys from L2 (its error
        raised, nothing written yet)."""
        if self.volatile is not None and self.persistent is not None:
            self.volatile.remove(table, keys)

    def _l2_after_l3(
        self, op: Callable[..., None], table: str, *args: npt.NDArray[np.generic]
    ) -> None:
        """L2's part of a write after L3 took it: with an L3, L2 holds no copy of the keys
        any more (:meth:`_drop_l2_copies`), so its failure loses nothing (warned, throttled);
        L2 alone raises."""
        if self.persistent is None:
            op(table, *args)
            return
        try:
            op(table, *args)
        except BackendError as exc:
            self._l2_behind(table, "L2 missed a write of %s that L3 took (it is read from L3): %s",
                            table, exc)  # fmt: skip

    @property
    def l2_writes(self) -> L2Writes | None:
        """The log of this process's writes to L2 (None without L2): take
        ``l2_writes.token()`` before reading rows to backfill, hold keys around any other
        write to L2 (``l2_writes.writing``)."""
        return None if self.volatile is None else writes_of(self.volatile)

    def l2_token(self) -> int | None:
        """What to pass :meth:`backfill` as ``since`` for rows read after this call."""
        writes = self.l2_writes
        return None if writes is None else writes.token()

    @contextmanager
    def _l2_writing(self, table: str, keys: Keys | None) -> Iterator[None]:
        writes = self.l2_writes
        if writes is None:
            yield
            return
        with writes.writing(table, keys):
            yield

    def backfill(self, table: str, keys: Keys, values: Stored, since: int | None = None) -> None:
        """Stored rows L3 answered, into L2 where it does not hold the key
        (``cache_missed_embeddings``); a no-op without L2. Only absent keys: an update may
        have written a newer row into L2 (and L3) since L3 was read. With ``since`` (the
        :meth:`l2_token` taken before the read), neither the keys this process wrote to or
        removed from L2 after it (an update, a delete, a journal follower's drop): their
        rows read then may be older than L3's now (:class:`L2Writes`)."""
        if self.volatile is None:
            return
        if since is None:
            self.volatile.insert_absent(table, keys, values)
        else:
            writes_of(self.volatile).insert_absent(self.volatile, table, keys, values, since)

    def fill_l2_from_l3(self, table: str, share: float = 1.0) -> int:
        """Copy the first ``share`` of a table's L3 rows into L2 (rows as stored); how many."""
        if self.volatile is None or self.persistent is None:
            return 0
        done = 0
        try:
            # size() scans the keys: count them only when a share is wanted
            left = int(round(share * self.persistent.size(table))) if share < 1 else 1 << 62
            for keys, vectors in self.persistent.dump(table):
                n = min(keys.size, left - done)
                if n <= 0:
                    break
                self.volatile.insert(table, keys[:n], vectors[:n])
                done += n
        except HPSError as exc:
            raise FillError(
                f"L2 fill of {table} from L3 stopped after {done} rows: {exc}", done
            ) from exc
        return done

    def versioned(
        self, spec: TableSpec, *, l2: bool = True, l3: bool = True
    ) -> VersionedRows | None:
        """The table's rows with their update versions in L3 (if ``l3``) and L2 (if ``l2``):
        what the Kafka applier writes through; ``None`` when neither tier takes them."""
        tiers = [t for t, wanted in ((self.persistent, l3), (self.volatile, l2)) if wanted]
        open_ = [t for t in tiers if t is not None]
        if not open_:
            return None
        if l2 and self.volatile is not None:  # its L2 writes hold their keys (backfills)
            return GuardedRows(spec, open_, writes_of(self.volatile))
        return VersionedRows(spec, open_)

    # -- the handles ----------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Let a secondary L3 replay what its writer wrote since (a no-op otherwise)."""
        self._catch_up(within=0.0)

    def catch_up_if_stale(self) -> None:
        """:meth:`catch_up` unless one began less than :data:`SECONDARY_LAG_S` ago: what a
        read of L3 does first (reads other than :meth:`fetch` call it themselves)."""
        self._catch_up(within=SECONDARY_LAG_S)

    def _catch_up(self, within: float) -> None:
        """:meth:`catch_up` unless one began less than ``within`` seconds ago (waiting for
        one under way: until it ends, reads see L3 as it was before it)."""
        if self.persistent is None:
            return
        with self._catching_up:
            started = time.monotonic()
            if within and started - self._caught_up_at < within:
                return
            self.persistent.catch_up()
            self._caught_up_at = started

    def catch_up_once(self) -> Callable[[], None]:
        """A ``before_l3`` hook that calls :meth:`catch_up` the first time it runs only.

        A secondary's catch-up replays the writer's WAL since the last one: readers
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

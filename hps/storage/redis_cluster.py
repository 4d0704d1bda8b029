"""Redis as the L2: one node or a Redis Cluster (config types ``redis_cluster`` and ``redis``).

Layout (docs/redis.md): the rows of table ``<model>.<table>`` are hash-partitioned
into ``num_partitions`` Redis hashes named ``hps_et{<model>.<table>/p<i>}``; the braces are a
cluster hash tag, so each partition lives in one slot (a Cluster spreads the partitions over
its nodes) and one partition's commands form one pipeline. A field is the key as 8 bytes
int64 little-endian, its value the stored row's raw bytes (the table's row format,
:mod:`hps.rowformat`: 4 x dim for float32). The string ``hps_tm{<model>.<table>}`` records
the table's row format and dimension (JSON); ``open_table`` refuses a table stored with
another (``ConfigError``), and rows written before it was recorded are float32. Every write
sets it again where it is missing (``SET NX`` in the pipeline of each chunk, before the
rows), so rows written after Redis lost everything (a restart, a flush, a failover to an
empty node) come back with their record.

A handle keeps the record it opened a table with, and every call checks that Redis still
holds it (:meth:`RedisStore._check_record`): a fetch reads ``hps_tm`` in the pipeline of its
first chunk (no extra round trip); ``insert``, ``insert_absent`` and ``remove`` read it before
they write anything, ``dump`` before it reads (one ``GET`` each). A record that exists and
differs (another process dropped the table and created it again in another format or
dimension, ``hps import --force``, after this handle opened it) is a ``BackendError`` that
says to reload the process: rows of two formats of the same byte size (float16 and int8 of
dim 8) would otherwise be read, or written, in the wrong one. A missing record is no error:
a dropped table reads as empty, and a reader may open a table before its writer creates it.

With a finite ``overflow_margin`` (rows per partition, as in HugeCTR) each partition also has
a sorted set ``hps_ts{<model>.<table>/p<i>}`` (same slot) scoring every key by the time of its
last write (``evict_oldest``) or of its last write or read (``evict_least_used``). After an
insert leaves a partition above the margin, rows are evicted down to
``overflow_resolution_target x overflow_margin``: lowest scores first (rows without a score,
written while no margin was configured, count as oldest), or random fields (``HRANDFIELD``)
for ``evict_random``. Without a margin no bookkeeping is kept and a fetch is a plain
pipelined HMGET.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, cast

import numpy as np

from hps.config import PersistentDBConfig, VolatileDBConfig
from hps.dedup import greatest_occurrence, last_occurrence
from hps.errors import (
    BackendError,
    BackendUnavailable,
    ConfigError,
    RequestError,
    UnknownTableError,
)
from hps.io.chunks import rows_per_chunk
from hps.rowformat import FORMATS, RowFormat, Stored
from hps.storage.base import (
    LEGACY_FORMAT,
    AccessMode,
    EmbeddingStore,
    WriteMode,
    check_max_rows,
    check_rows,
    refused,
)
from hps.storage.breaker import CircuitBreaker
from hps.storage.keybytes import key_bytes
from hps.storage.redis_conn import (
    DEFAULT_MAX_BULK_BYTES,
    Client,
    connect,
    max_bulk_bytes,
    one_timeout_per_node,
    translated,
)
from hps.storage.redis_conn import close as close_client
from hps.storage.redis_layout import (
    Group,
    Reply,
    group_by_partition,
    hash_name,
    interleave,
    meta_name,
    pair_items,
    redis_bytes_per_row,
    stamp_name,
    unsort,
)
from hps.types import Keys, Mask, TableSpec

if TYPE_CHECKING:
    from redis.client import Pipeline
    from redis.cluster import ClusterPipeline

_HSET_GREATER = """
local function greater(new, old)
  if #new ~= #old then return true end
  for pos = #new - 3, 1, -4 do
    local a, b = struct.unpack('<f', new, pos), struct.unpack('<f', old, pos)
    if a ~= b then return a > b end
  end
  return false
end
for i = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if not old or greater(ARGV[i + 1], old) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
"""
_SCRIPTS: dict[WriteMode, str] = {
    "absent": "for i = 1, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end",
    "max": _HSET_GREATER,
}
"""One partition's fields and rows, ``EVAL``-ed (Redis caches them): ``insert_absent``'s
HSETNX of each; ``insert_max``'s compare (float32 elements, the last most significant) and
set."""
CHUNKS_PER_TIMEOUT = 4  # a call's chunks per hps_socket_timeout_s of its budget (call_budget_s)
_EVICT_ROUNDS = 4  # rounds per overflow: stale scores or concurrent writers may need more


@dataclass(frozen=True)
class _Table:
    spec: TableSpec
    hashes: list[bytes]
    stamps: list[bytes]
    meta: bytes  # the name of its format record (``hps_tm{...}``)
    record: bytes  # the record this handle opened it with (what it writes when first)


class RedisStore(EmbeddingStore):
    """EmbeddingStore over Redis; see the module docstring for the layout and eviction."""

    name = "redis_cluster"
    placement = "server"

    def __init__(
        self,
        client: Client,
        cfg: VolatileDBConfig,
        *,
        cluster: bool,
        max_bulk_bytes: int = DEFAULT_MAX_BULK_BYTES,
    ) -> None:
        self._r = client
        self.cluster = cluster
        self._max_bulk = max_bulk_bytes  # the server's proto-max-bulk-len: the longest row
        self._partitions = cfg.num_partitions
        self._batch = cfg.max_batch_size
        self._limited = cfg.bounded
        self._margin = cfg.overflow_margin
        self._target = max(0, math.floor(cfg.overflow_margin * cfg.overflow_resolution_target))
        self._policy = cfg.overflow_policy
        self._stamped = self._limited and self._policy != "evict_random"
        self._touch = self._limited and self._policy == "evict_least_used"
        self._timeout_s = cfg.hps_socket_timeout_s  # also a call's budget (call_budget_s)
        self._tables: dict[str, _Table] = {}
        self.breaker = CircuitBreaker(
            f"Redis L2 at {cfg.address}", cfg.hps_breaker_backoff_s, cfg.hps_breaker_max_backoff_s
        )

    @classmethod
    def from_config(
        cls, cfg: VolatileDBConfig | PersistentDBConfig, mode: AccessMode = "read_write"
    ) -> RedisStore:
        assert isinstance(cfg, VolatileDBConfig)
        client, cluster = connect(cfg)
        return cls(client, cfg, cluster=cluster, max_bulk_bytes=max_bulk_bytes(client))

    @classmethod
    def bytes_per_row(cls, row_bytes: int, *, bounded: bool = False) -> float:
        return redis_bytes_per_row(row_bytes, bounded)

    @contextlib.contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        """One call: behind the circuit breaker, and waiting on a node that does not answer
        at most once (:func:`hps.storage.redis_conn.one_timeout_per_node`)."""
        with self.breaker.guard(where), one_timeout_per_node():
            yield

    @property
    def client(self) -> Client:
        """The driver client (``hps bench storage`` measures raw commands over it)."""
        return self._r

    # -- tables -----------------------------------------------------------------------------

    def open_table(self, spec: TableSpec) -> None:
        """Declare a table; rows already stored in another format or dimension are a
        ConfigError. The first to open a table records its format and dimension."""
        meta = meta_name(spec.name)
        record = json.dumps({"row_dtype": spec.row_dtype, "dim": spec.dim}).encode()
        t = _Table(
            spec,
            [hash_name(spec.name, p) for p in range(self._partitions)],
            [stamp_name(spec.name, p) for p in range(self._partitions)],
            meta,
            record,
        )
        with one_timeout_per_node(), translated(f"open_table {spec.name}"):
            recorded, stored = self._read_format(spec, t.hashes)
            fresh = not recorded and self._same(spec, stored)  # new, or from before records
            if fresh and not self._r.execute_command("SET", meta, record, "NX"):  # another won
                stored = self._recorded(spec, self._r.execute_command("GET", meta), [])
        if not self._same(spec, stored):
            assert stored is not None
            if not recorded:
                raise _unrecorded(spec, *stored)
            raise refused(spec, "Redis", *stored)
        self._tables[spec.name] = t

    def stored_format(self, spec: TableSpec) -> tuple[RowFormat, int] | None:
        """The table's ``hps_tm`` record, else the float32 width of a sampled row (rows
        from before records), else None."""
        hashes = [hash_name(spec.name, p) for p in range(self._partitions)]
        with one_timeout_per_node(), translated(f"stored_format {spec.name}"):
            return self._read_format(spec, hashes)[1]

    def _read_format(
        self, spec: TableSpec, hashes: list[bytes]
    ) -> tuple[bool, tuple[RowFormat, int] | None]:
        """Whether the table's format is recorded, and the format and dimension its rows
        are held in (:meth:`_recorded`): one pipeline, nothing written."""
        pipe = self._r.pipeline(transaction=False)
        pipe.execute_command("GET", meta_name(spec.name))
        for h in hashes:
            pipe.execute_command("HRANDFIELD", h, 1, "WITHVALUES")
        replies = pipe.execute()
        return replies[0] is not None, self._recorded(spec, replies[0], replies[1:])

    @staticmethod
    def _same(spec: TableSpec, stored: tuple[RowFormat, int] | None) -> bool:
        return stored is None or (stored[0] is spec.fmt and stored[1] == spec.dim)

    @staticmethod
    def _recorded(
        spec: TableSpec, raw: Reply, samples: list[Reply]
    ) -> tuple[RowFormat, int] | None:
        """The table's recorded format and dimension; else, where rows of the days before
        formats were recorded are sampled, float32 of their width (or None: no rows)."""
        if raw is not None:
            try:
                doc = json.loads(raw)
                return FORMATS[doc["row_dtype"]], int(doc["dim"])
            except (ValueError, KeyError, TypeError) as exc:  # written by another release?
                raise BackendError(
                    f"Redis: the record of table {spec.name} ({meta_name(spec.name)!r}) cannot be "
                    f"read: {type(exc).__name__}: {exc}"
                ) from None
        widths = {len(v) for s in samples for v in pair_items(s)[1]}
        if not widths:
            return None
        if widths == {LEGACY_FORMAT.row_bytes(spec.dim)}:
            return LEGACY_FORMAT, spec.dim
        return LEGACY_FORMAT, max(widths - {LEGACY_FORMAT.row_bytes(spec.dim)}) // 4

    def _check_record(self, t: _Table, raw: Reply, what: str) -> None:
        """Refuse a call on a table whose format record ``raw`` (the reply to a GET of
        ``hps_tm``) is no longer the one this handle opened it with: another process
        dropped it and created it again in another format or dimension. None (no record:
        dropped, not created again; or not created yet) and an equal record pass; so does a
        record of the same format and dimension written otherwise."""
        if isinstance(raw, Exception):
            raise raw  # in a pipeline read with raise_on_error=False: translated above
        if raw is None or raw == t.record:
            return
        spec = t.spec
        now = self._recorded(spec, raw, [])
        if self._same(spec, now):
            return
        assert now is not None
        raise BackendError(
            f"Redis: {what} refused: this process opened table {spec.name} as "
            f"{spec.row_dtype} rows of dimension {spec.dim}, but Redis now records it as "
            f"{now[0].name} rows of dimension {now[1]} (the table was dropped and created "
            "again since, e.g. by `hps import --force`); reload this process (`hps reload` "
            "for a served model, a restart for others)"
        )

    def _check_now(self, t: _Table, what: str) -> None:
        """:meth:`_check_record` with a GET of its own (one round trip): what a write does
        before it writes anything, and a dump before it reads."""
        with translated(what):
            raw = self._r.execute_command("GET", t.meta)
        self._check_record(t, raw, what)

    def drop_table(self, table: str) -> None:
        """Delete the table's partitions, their timestamps and its recorded format."""
        names = [meta_name(table)]
        for p in range(self._partitions):
            names += [hash_name(table, p), stamp_name(table, p)]
        with self._guard(f"drop {table}"), translated(f"drop {table}"):
            pipe = self._r.pipeline(transaction=False)
            for name in names:  # one key per command: each in its own cluster slot
                pipe.execute_command("UNLINK", name)
            pipe.execute()
        self._tables.pop(table, None)

    def _table(self, table: str) -> _Table:
        try:
            return self._tables[table]
        except KeyError:
            raise UnknownTableError(
                f"table {table!r} is not open in Redis; open: {sorted(self._tables)}"
            ) from None

    # -- data -------------------------------------------------------------------------------

    def _chunks(self, keys: Keys) -> Iterator[tuple[int, np.ndarray, list[Group], list[bytes]]]:
        """Per chunk of ``max_batch_size`` keys: its start, the order that groups it by
        partition, the ``(partition, lo, hi)`` groups and the keys' field bytes in that order."""
        for start in range(0, keys.size, self._batch):
            chunk = keys[start : start + self._batch]
            order, groups = group_by_partition(chunk, self._partitions)
            yield start, order, groups, key_bytes(chunk[order])

    def fetch(self, table: str, keys: Keys) -> tuple[Stored, Mask]:
        t = self._table(table)  # an unknown table is no answer of Redis's (nor a probe)
        if keys.size == 0:
            return t.spec.fmt.empty(0, t.spec.dim), np.zeros(0, np.bool_)
        with self._guard(f"fetch {table}"):
            return self._fetch(t, keys)

    def _fetch(self, t: _Table, keys: Keys) -> tuple[Stored, Mask]:
        table = t.spec.name
        fmt, dim = t.spec.fmt, t.spec.dim
        row_bytes = fmt.row_bytes(dim)
        found = np.ones(keys.size, np.bool_)
        pieces: list[bytes] = []  # one row per key, request order; joined once at the end
        budget_s = call_budget_s(self._timeout_s, -(-keys.size // self._batch))
        deadline = time.monotonic() + budget_s
        for start, order, groups, fields in self._chunks(keys):
            _within(deadline, budget_s, f"fetch {table}")
            first = start == 0  # its pipeline reads the format record too
            with translated(f"fetch {table}"):
                pipe = self._r.pipeline(transaction=False)
                for p, lo, hi in groups:
                    pipe.execute_command("HMGET", t.hashes[p], *fields[lo:hi])
                if first:
                    pipe.execute_command("GET", t.meta)
                if self._touch:
                    self._stamp(pipe, t, groups, fields, b"XX")
                # the touch is best effort: a Redis at maxmemory refuses the ZADD (a write)
                # but answers the reads, which must not fail for it
                replies = pipe.execute(raise_on_error=False)
                for reply in replies[: len(groups)]:
                    if isinstance(reply, Exception):
                        raise reply
                if first:
                    self._check_record(t, replies[len(groups)], f"fetch {table}")
            flat = list(chain.from_iterable(replies[: len(groups)]))
            got = unsort(flat, order, len(groups))
            if got.count(None):
                hit = np.fromiter(map(bool, got), np.bool_, count=len(got))
                found[start : start + hit.size] = hit
                filled = np.empty(hit.size, object)
                filled[:] = got
                filled[~hit] = bytes(row_bytes)
                got = filled.tolist()
            pieces += got
        blob = bytearray().join(pieces)  # writable: the caller may fill rows in place
        if len(blob) != row_bytes * keys.size:
            raise BackendError(
                f"fetch {table}: Redis holds rows that are not {fmt.name} rows of dimension {dim}"
            )
        return np.frombuffer(blob, fmt.dtype).reshape(keys.size, fmt.width(dim)), found

    def insert(self, table: str, keys: Keys, values: Stored, *, durable: bool = False) -> None:
        self._write(table, keys, values, how="upsert")

    def insert_absent(self, table: str, keys: Keys, values: Stored) -> None:
        """One script per partition and chunk (``HSETNX`` of each pair, atomic in Redis); a
        key repeated in the batch takes its last row, as in ``insert``."""
        self._write(table, keys, values, how="absent")

    def insert_max(self, table: str, keys: Keys, values: Stored) -> None:
        """One script per partition and chunk (compare and set of each pair, atomic in
        Redis)."""
        check_max_rows(table, keys, values)
        self._write(table, keys, values, how="max")

    def _write(self, table: str, keys: Keys, values: Stored, *, how: WriteMode) -> None:
        spec = self._table(table).spec
        check_rows(spec, keys, values)
        if keys.size == 0:
            return
        row_bytes = spec.fmt.row_bytes(spec.dim)
        if row_bytes > self._max_bulk:  # Redis would drop the connection: no retry helps
            raise RequestError(
                f"insert {table}: a row of {spec.row_dtype} of dimension {spec.dim} is "
                f"{row_bytes} bytes, more than the Redis server's proto-max-bulk-len "
                f"({self._max_bulk} bytes), the longest value it accepts; nothing was stored"
            )
        if how != "upsert":  # HSET of a repeated field keeps the last by itself
            keys, values = (greatest_occurrence if how == "max" else last_occurrence)(keys, values)
        with self._guard(f"insert {table}"):
            self._insert(table, keys, np.ascontiguousarray(values), how)

    def _insert(self, table: str, keys: Keys, values: Stored, how: WriteMode) -> None:
        t = self._table(table)
        self._check_now(t, f"insert {table}")
        row = f"V{t.spec.fmt.row_bytes(t.spec.dim)}"
        for start, order, groups, fields in self._chunks(keys):
            rows = values[start : start + self._batch].view(row).ravel()[order].tolist()
            with translated(f"insert {table}"):
                pipe = self._r.pipeline(transaction=False)
                # rows never outlive their record: a Redis restarted, flushed or failed
                # over to an empty node since open_table gets it back with the rows
                pipe.execute_command("SET", t.meta, t.record, "NX")
                for p, lo, hi in groups:
                    pairs = interleave(fields[lo:hi], rows[lo:hi])
                    if how == "upsert":
                        pipe.execute_command("HSET", t.hashes[p], *pairs)
                    else:
                        pipe.execute_command("EVAL", _SCRIPTS[how], 1, t.hashes[p], *pairs)
                if self._stamped:  # a held row keeps the time of its own write
                    self._stamp(pipe, t, groups, fields, *((b"NX",) if how == "absent" else ()))
                if self._limited:
                    for p, _, _ in groups:
                        pipe.execute_command("HLEN", t.hashes[p])
                replies = pipe.execute()
            if self._limited:
                for (p, _, _), length in zip(groups, replies[-len(groups) :], strict=True):
                    if int(length) > self._margin:
                        self._evict(t, p, int(length))

    def remove(self, table: str, keys: Keys, *, durable: bool = False) -> None:
        self._table(table)
        if keys.size == 0:
            return  # nothing to send: no probe of the breaker either
        with self._guard(f"remove {table}"):
            self._remove(table, keys)

    def _remove(self, table: str, keys: Keys) -> None:
        t = self._table(table)
        self._check_now(t, f"remove {table}")
        for _, _, groups, fields in self._chunks(keys):
            with translated(f"remove {table}"):
                pipe = self._r.pipeline(transaction=False)
                for p, lo, hi in groups:
                    pipe.execute_command("HDEL", t.hashes[p], *fields[lo:hi])
                    if self._stamped:
                        pipe.execute_command("ZREM", t.stamps[p], *fields[lo:hi])
                pipe.execute()

    def size(self, table: str) -> int:
        t = self._table(table)  # an unknown table is no answer of Redis's (nor a probe)
        with self._guard(f"size {table}"):
            return self._size(t)

    def _size(self, t: _Table) -> int:
        table = t.spec.name
        with translated(f"size {table}"):
            pipe = self._r.pipeline(transaction=False)
            for h in t.hashes:
                pipe.execute_command("HLEN", h)
            return sum(int(n) for n in pipe.execute())

    def dump(self, table: str, chunk_rows: int | None = None) -> Iterator[tuple[Keys, Stored]]:
        """Yield (keys, stored rows) chunks of the whole table (HSCAN of each partition, of
        about ``chunk_rows`` fields a page; default: sized by bytes,
        :func:`hps.io.chunks.rows_per_chunk`)."""
        t = self._table(table)
        with self._guard(f"dump {table}"):
            self._check_now(t, f"dump {table}")
        fmt = t.spec.fmt
        if chunk_rows is None:
            chunk_rows = rows_per_chunk(fmt.row_bytes(t.spec.dim) + 8)
        for h in t.hashes:
            cursor = 0
            while True:  # each page a call of its own: the consumer's work is not timed
                with self._guard(f"dump {table}"), translated(f"dump {table}"):
                    cursor, reply = self._r.hscan(h, cursor, count=chunk_rows)
                page = cast("dict[bytes, bytes]", reply)  # fields and values, undecoded
                if page:
                    keys = np.frombuffer(b"".join(page), "<i8").astype(np.int64)
                    vals = fmt.from_bytes(b"".join(page.values()), t.spec.dim)
                    yield keys, vals
                if int(cursor) == 0:
                    break

    def close(self) -> None:
        close_client(self._r)

    # -- capacity ---------------------------------------------------------------------------

    def _stamp(self, pipe: Pipeline | ClusterPipeline, t: _Table, groups: list[Group],
               fields: list[bytes], *flags: bytes) -> None:  # fmt: skip
        """Queue ZADD of the current time (µs) for every key, per partition."""
        now = str(time.time_ns() // 1000).encode()
        for p, lo, hi in groups:
            part = fields[lo:hi]
            pipe.execute_command("ZADD", t.stamps[p], *flags, *interleave([now] * len(part), part))

    def _evict(self, t: _Table, p: int, length: int) -> None:
        """Evict rows of partition ``p`` until it holds at most the resolution target."""
        table = t.spec.name
        with translated(f"evicting from {table} partition {p}"):
            if self._stamped and int(self._r.zcard(t.stamps[p])) < length:
                self._adopt(t, p)
            for _ in range(_EVICT_ROUNDS):
                excess = length - self._target
                if excess <= 0:
                    return
                victims: list[bytes] = []
                if self._stamped:
                    victims = pair_items(self._r.zpopmin(t.stamps[p], excess))[0]
                if not victims:
                    sample: Reply = self._r.hrandfield(t.hashes[p], excess)
                    victims = list(sample or [])
                if not victims:
                    return
                pipe = self._r.pipeline(transaction=False)
                for lo in range(0, len(victims), self._batch):
                    pipe.execute_command("HDEL", t.hashes[p], *victims[lo : lo + self._batch])
                    if self._stamped:
                        pipe.execute_command("ZREM", t.stamps[p], *victims[lo : lo + self._batch])
                pipe.execute_command("HLEN", t.hashes[p])
                length = int(pipe.execute()[-1])

    def _adopt(self, t: _Table, p: int) -> None:
        """Score 0 (evicted first) for rows that have no timestamp yet.

        Rows written while no overflow_margin was configured have no score; this scans the
        partition once (HSCAN; ZADD NX keeps the scores that exist).
        """
        cursor = 0
        while True:
            cursor, page = self._r.hscan(t.hashes[p], cursor, count=self._batch)
            if page:
                fields: list[bytes | str] = list(page)
                zero: list[bytes | str] = [b"0"] * len(fields)
                self._r.execute_command("ZADD", t.stamps[p], "NX", *interleave(zero, fields))
            if int(cursor) == 0:
                return


def _unrecorded(spec: TableSpec, fmt: RowFormat, dim: int) -> ConfigError:
    """The error for a table whose rows Redis holds without their format record: read as
    rows of the days before records (float32), they do not fit ``spec``."""
    name = spec.name
    return ConfigError(
        f"table {name}: Redis holds rows of it but no record of their format "
        f"({meta_name(name).decode()} is missing), so their format was inferred from the rows "
        f"as for tables written before formats were recorded: {fmt.name} rows of dimension "
        f"{dim}, but the table is configured as {spec.row_dtype} rows of dimension "
        f"{spec.dim}. The record is lost when Redis restarts, is flushed or fails over to an "
        "empty node while a client keeps writing rows. Empty the L2 to go on (lookups read "
        "L3 and refill it): FLUSHDB, or delete the table's keys "
        f"(hps_et{{{name}/p*}}, hps_ts{{{name}/p*}}); `hps import --force` is not needed "
        "for it (it drops the L3 rows too)"
    )


def call_budget_s(timeout_s: float, chunks: int) -> float:
    """How long one call of ``chunks`` chunks may take: ``timeout_s`` (each read's own
    timeout) per :data:`CHUNKS_PER_TIMEOUT` chunks, at least ``timeout_s``. A server that
    answers each chunk just in time holds a call for a quarter of the timeouts it has
    chunks, not all of them; a healthy one (a chunk in well under a second) answers a
    refresh slice of millions of keys within it."""
    return timeout_s * max(1.0, chunks / CHUNKS_PER_TIMEOUT)


def _within(deadline: float, budget_s: float, what: str) -> None:
    """BackendUnavailable once a call's chunks have taken longer than ``budget_s``
    (:func:`call_budget_s`)."""
    if time.monotonic() > deadline:
        raise BackendUnavailable(
            f"Redis: {what} took longer than {budget_s:g} s (hps_socket_timeout_s per "
            f"{CHUNKS_PER_TIMEOUT} chunks of max_batch_size keys) over its chunks: the server "
            "is too slow"
        )

"""A consumed Kafka message as update rows: decoded once, then made a batch per target table.

:func:`read_message` decodes and checks what does not depend on the table it goes to (the
topic's name, the payload, the update version's bound, finite values);
:meth:`Incoming.batch` checks the rest against one table of one model version (dimension,
the row format's range) and makes the :class:`hps.types.UpdateBatch`. Which tables of which
versions a message goes to is :mod:`hps.updates.routing`'s decision.
:func:`decode_message` is both for a fixed set of tables (one version of each model).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hps.errors import InvalidValueError, ShapeError, UnknownTableError
from hps.tiers import check_encodable
from hps.types import TableSpec, UpdateBatch
from hps.updates import codec, metrics
from hps.validate import check_not_reserved

if TYPE_CHECKING:
    from confluent_kafka import Message

MAX_AHEAD_S = 300.0  # update_source.hps_max_version_ahead_s's default


@dataclass(frozen=True)
class Incoming:
    """One decoded message of topic ``hps_et.<model>.<table>``."""

    model: str
    table: str
    decoded: codec.Decoded
    ts_ns: int  # the message's timestamp (0: none)
    partition: int

    @property
    def qualified(self) -> str:
        return f"{self.model}.{self.table}"

    @property
    def tag(self) -> int | None:
        """The model version the message is tagged with (None: untagged)."""
        return self.decoded.model_version

    @property
    def ts_ms(self) -> int:
        return self.ts_ns // 1_000_000

    def batch(self, spec: TableSpec) -> UpdateBatch:
        """The message's rows for ``spec`` (one version of its table); ShapeError for the
        wrong dimension, InvalidValueError for values its row format cannot hold."""
        d = self.decoded
        if d.values is not None and d.keys.size:
            if d.dim != spec.dim:
                raise ShapeError(
                    f"{spec.name}: vectors of dim {d.dim}, the table has dim {spec.dim}"
                )
            check_encodable(spec, d.values)  # beyond what the table's row format holds
        extras = {"partition": str(self.partition)}
        if self.ts_ns > 0:  # publish time: LogAppendTime where the topic uses it, else CreateTime
            extras["published_ns"] = str(self.ts_ns)
        return UpdateBatch(spec.name, d.keys, d.values, int(d.version), d.delete, extras)


def batches_for(inc: Incoming, specs: list[TableSpec]) -> tuple[list[UpdateBatch], str]:
    """``inc``'s batch for each of ``specs`` that can take it, and why the others cannot
    ("" when all can): a message one version's table refuses (another dimension, a value
    beyond its format) still goes to the versions that take it."""
    found: list[UpdateBatch] = []
    refused: list[str] = []
    for spec in specs:
        try:
            found.append(inc.batch(spec))
        except (ShapeError, InvalidValueError) as exc:
            refused.append(f"{type(exc).__name__}: {exc}")
    return found, "; ".join(refused)


def read_message(
    msg: Message,
    *,
    max_version_ahead_s: float = MAX_AHEAD_S,
    receipt_ns: int | None = None,
    count: bool = True,
) -> Incoming:
    """Decode ``msg``; FormatError (DecodeError, VersionError) or InvalidValueError when bad.

    The update version must not lie more than ``max_version_ahead_s`` after the consumer's
    clock at receipt (``receipt_ns``, default now), nor after the message's timestamp when
    that is earlier (:func:`hps.updates.codec.check_version`): VersionError. The producer
    sets neither the consumer's clock nor a ``LogAppendTime``, so no message can pin a key.
    ``count``: counted in ``hps_updates_messages_total`` (not when a replay reads it again).
    """
    topic = msg.topic() or ""  # a consumed message has its topic
    model, table = codec.parse_topic(topic)
    _, ts_ms = msg.timestamp()
    ts_ns = max(ts_ms, 0) * 1_000_000
    d = codec.decode(msg.value(), timestamp_ns=ts_ns, has_key=bool(msg.key()))
    codec.check_version(
        d.version,
        receipt_ns=time.time_ns() if receipt_ns is None else receipt_ns,
        timestamp_ns=ts_ns,
        max_ahead_ns=int(max_version_ahead_s * 1e9),
    )
    if count:
        metrics.MESSAGES.labels(d.format).inc()
    if d.values is not None and d.keys.size and not np.isfinite(d.values).all():
        raise InvalidValueError(f"{model}.{table}: vectors contain NaN or infinity")
    check_not_reserved(f"{model}.{table}", d.keys)  # upserts and deletes alike
    return Incoming(model, table, d, ts_ns, int(msg.partition() or 0))


def decode_message(
    msg: Message,
    tables: Mapping[str, TableSpec],
    *,
    max_version_ahead_s: float = MAX_AHEAD_S,
    receipt_ns: int | None = None,
) -> UpdateBatch:
    """A consumed message as an UpdateBatch of one of ``tables`` (one version of each
    table: a message tagged with another version is an UnknownTableError);
    FormatError/RequestError when it is bad (:func:`read_message`, :meth:`Incoming.batch`)."""
    inc = read_message(msg, max_version_ahead_s=max_version_ahead_s, receipt_ns=receipt_ns)
    spec = tables.get(inc.qualified)
    if spec is None or spec.qualified != inc.qualified:
        spec = next((s for s in tables.values() if s.qualified == inc.qualified), None)
    if spec is None:
        raise UnknownTableError(f"no configured table {inc.qualified} for topic {msg.topic()}")
    if inc.tag is not None and inc.tag != spec.version:
        raise UnknownTableError(f"model {inc.model} has no version {inc.tag} here")
    return inc.batch(spec)

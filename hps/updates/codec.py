"""The wire format of online updates (docs/updates.md draws it byte by byte).

Two payloads are decoded, both without a Python loop per key:

- **native** (what :class:`hps.updates.Publisher` writes), little-endian::

      offset size  field
      0      4     magic  b"HPSU"
      4      1     format version (1; 2 when tagged, below)
      5      1     dtype code of the values (1 = float32, 2 = float16)
      6      2     flags (bit 0: delete; the other bits must be 0)
      8      4     dim    (uint32; may be 0 in a delete)
      12     4     count  (uint32)
      16     8     update version (uint64, monotonically increasing per producer)
      24     8*count        keys   (int64)
      ...    count*dim*size values (absent for a delete)

  Format version 2 is a message **tagged** with a model version (``Publisher(version=N)``):
  the same header, then ``24 4 model version`` (uint32, >= 1) and ``28 4 reserved`` (0),
  and the keys at offset 32. Format 1 (what an untagged ``Publisher`` still writes) and
  HugeCTR's messages are untagged: :attr:`Decoded.model_version` is ``None``.

- **HugeCTR** (what HugeCTR's ``KafkaMessageSink`` wrote): no Kafka key; ``uint32`` magic
  ``"HCTR"`` (bytes ``48 43 54 52``), ``uint32`` value size in bytes, then ``count`` times
  ``[int64 key][value_size bytes of float32]``. It carries no version: the consumer uses the
  message's broker timestamp (see :func:`decode`).

A truncated or inconsistent payload raises :class:`hps.errors.DecodeError` naming the reason;
:func:`check_version` raises its subclass :class:`hps.errors.VersionError` for a version
too far ahead of the consumer's clock (or of the message's timestamp, when that is earlier).
No other exception escapes :func:`decode`.
"""

from __future__ import annotations

import numbers
import re
import struct
from dataclasses import dataclass

import numpy as np

from hps.errors import DecodeError, InvalidValueError, VersionError
from hps.types import Keys, Vectors

TOPIC_PREFIX = "hps_et."
NATIVE_MAGIC = b"HPSU"
HUGECTR_MAGIC = b"HCTR"
FORMAT_VERSION = 1  # untagged
FORMAT_TAGGED = 2  # tagged with a model version
FLAG_DELETE = 0x1
KNOWN_FLAGS = FLAG_DELETE

HEADER = struct.Struct("<4sBBHIIQ")
HEADER_SIZE = HEADER.size  # 24
TAG = struct.Struct("<II")  # model version, reserved (format 2 only)
TAGGED_HEADER_SIZE = HEADER_SIZE + TAG.size  # 32
MODEL_VERSION_MAX = 2**32 - 1
HUGECTR_HEADER = struct.Struct("<4sI")
HUGECTR_HEADER_SIZE = HUGECTR_HEADER.size  # 8
KEY_SIZE = 8

DTYPE_CODES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<f2")}
_CODE_OF = {dt: code for code, dt in DTYPE_CODES.items()}
UINT64_MAX = 2**64 - 1

NAME_PATTERN = "[A-Za-z0-9_-]+"  # a model's or table's name in an update topic
_NAME_RE = re.compile(NAME_PATTERN)
_TOPIC_RE = re.compile(r"^hps_et\.([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)$")


@dataclass(frozen=True)
class Decoded:
    """One decoded message: ``values`` is ``None`` for a delete (and an empty beacon).

    ``version`` is the update version (per key, newest wins); ``model_version`` the model
    version the message is tagged with, ``None`` for an untagged one."""

    keys: Keys
    values: Vectors | None
    version: int
    delete: bool
    dim: int
    format: str  # "native" | "hugectr"
    model_version: int | None = None


def check_version(
    version: int, *, receipt_ns: int, timestamp_ns: int = 0, max_ahead_ns: int
) -> None:
    """Refuse a version that lies more than ``max_ahead_ns`` after a clock the producer does
    not control (:class:`VersionError`).

    Versions are nanoseconds since the epoch (``Publisher``'s default, ``time.time_ns()``),
    or any smaller counter. A version far in the future would pin its keys: every later
    update would be older and skipped until the clock reached it, so such a message is
    dead-lettered instead. The bound is ``min(receipt_ns, timestamp_ns) + max_ahead_ns``:

    - ``receipt_ns``, the consumer's own clock when it received the message, is the bound
      a producer cannot move: a forged ``CreateTime`` (or, in HugeCTR's format, a forged
      timestamp that *is* the version) changes nothing. A replay days later passes: its
      versions lie in the past.
    - ``timestamp_ns`` (the message's timestamp, 0 when it has none) only ever tightens it:
      the broker's ``LogAppendTime`` where the topic uses it (what ``hps`` creates update
      topics with), else the producer's ``CreateTime``, whose version should not run ahead
      of its own timestamp either.
    """
    clock, which = receipt_ns, "the consumer's clock at receipt"
    if 0 < timestamp_ns < receipt_ns:
        clock, which = timestamp_ns, "the message timestamp"
    if version > clock + max_ahead_ns:
        raise VersionError(
            f"update version {version} is {(version - clock) / 1e9:.3g}s ahead of {which} "
            f"({clock} ns); at most {max_ahead_ns / 1e9:g}s is allowed "
            "(update_source.hps_max_version_ahead_s)"
        )


def topic_name(model: str, table: str) -> str:
    """``hps_et.<model>.<table>``, the topic of one table.

    :class:`~hps.errors.InvalidValueError` for a name outside ``[A-Za-z0-9_-]+`` (a dot, a
    space, an empty one): :func:`parse_topic` would never match that topic, so no consumer
    would read what was sent to it."""
    for what, name in (("model", model), ("table", table)):
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise InvalidValueError(
                f"{what} {name!r} cannot name an update topic: model and table names must "
                f"match {NAME_PATTERN}"
            )
    return f"{TOPIC_PREFIX}{model}.{table}"


def parse_topic(topic: str) -> tuple[str, str]:
    """``(model, table)`` of an update topic; DecodeError for any other name."""
    m = _TOPIC_RE.match(topic)
    if m is None:
        raise DecodeError(f"topic {topic!r} is not an update topic (hps_et.<model>.<table>)")
    return m.group(1), m.group(2)


def native_row_bytes(dim: int, dtype: np.dtype = DTYPE_CODES[1]) -> int:
    return KEY_SIZE + dim * dtype.itemsize


def header_size(model_version: int | None) -> int:
    """Bytes before the keys: 24 untagged (format 1), 32 tagged (format 2)."""
    return HEADER_SIZE if model_version is None else TAGGED_HEADER_SIZE


def check_model_version(model_version: int) -> int:
    """``model_version`` as an int if it is one a message can carry: an integer (Python's or
    numpy's, not a bool) from 1 to 2**32 - 1; ``ValueError`` otherwise."""
    if isinstance(model_version, bool) or not isinstance(model_version, numbers.Integral):
        raise ValueError(f"model version {model_version!r} is not an integer")
    if not 1 <= int(model_version) <= MODEL_VERSION_MAX:
        raise ValueError(f"model version {model_version} is not in 1 ... {MODEL_VERSION_MAX}")
    return int(model_version)


def encode(
    keys: Keys,
    values: Vectors | None,
    version: int,
    *,
    delete: bool = False,
    dim: int | None = None,
    dtype: np.dtype | str = "<f4",
    model_version: int | None = None,
) -> bytes:
    """Pack one native message. ``values`` must be ``None`` for a delete; a
    ``model_version`` tags it (format 2), without one it is untagged (format 1)."""
    keys = np.ascontiguousarray(keys, dtype="<i8")
    if keys.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {keys.shape}")
    if not 0 <= version <= UINT64_MAX:
        raise ValueError(f"version {version} does not fit in uint64")
    vdtype = np.dtype(dtype).newbyteorder("<")
    if vdtype not in _CODE_OF:
        raise ValueError(f"unsupported value dtype {vdtype}; use float32 or float16")
    if delete:
        if values is not None:
            raise ValueError("a delete carries no values")
        dim = dim or 0
        body = b""
    else:
        if values is None:
            raise ValueError("an upsert needs values")
        values = np.ascontiguousarray(values, dtype=vdtype)
        if values.ndim != 2 or values.shape[0] != keys.size:
            raise ValueError(f"values must be ({keys.size}, dim), got {values.shape}")
        dim = int(values.shape[1])
        body = values.tobytes()
    header = HEADER.pack(
        NATIVE_MAGIC,
        FORMAT_VERSION if model_version is None else FORMAT_TAGGED,
        _CODE_OF[vdtype],
        FLAG_DELETE if delete else 0,
        dim,
        keys.size,
        version,
    )
    if model_version is not None:
        header += TAG.pack(check_model_version(model_version), 0)
    return header + keys.tobytes() + body


def encode_hugectr(keys: Keys, values: Vectors) -> bytes:
    """Pack one message the way HugeCTR's message sink did (for tests and migration tools)."""
    keys = np.asarray(keys, dtype="<i8")
    values = np.ascontiguousarray(values, dtype="<f4")
    if values.ndim != 2 or values.shape[0] != keys.size:
        raise ValueError(f"values must be ({keys.size}, dim), got {values.shape}")
    dim = values.shape[1]
    rows = np.empty(keys.size, dtype=_hugectr_row(dim * 4))
    rows["key"] = keys
    rows["value"] = values.view(np.uint8).reshape(keys.size, dim * 4)
    return HUGECTR_HEADER.pack(HUGECTR_MAGIC, dim * 4) + rows.tobytes()


def _hugectr_row(value_size: int) -> np.dtype:
    return np.dtype([("key", "<i8"), ("value", np.uint8, (value_size,))])


def decode(payload: bytes | None, *, timestamp_ns: int = 0, has_key: bool = False) -> Decoded:
    """Decode a message of either format.

    ``timestamp_ns`` is the version given to HugeCTR messages (pass the broker timestamp);
    ``has_key`` tells whether the Kafka message had a key (HugeCTR's messages never did).
    """
    if payload is None:
        raise DecodeError("empty message (tombstone)")
    view = memoryview(payload)
    magic = bytes(view[:4])
    if magic == NATIVE_MAGIC:
        return _decode_native(view)
    if magic == HUGECTR_MAGIC:
        if has_key:
            raise DecodeError("HugeCTR-format message with a Kafka key (HugeCTR never set one)")
        return _decode_hugectr(view, timestamp_ns)
    raise DecodeError(
        f"unknown magic {magic!r} ({len(payload)} bytes); expected b'HPSU' or b'HCTR'"
    )


def _decode_native(view: memoryview) -> Decoded:
    if len(view) < HEADER_SIZE:
        raise DecodeError(f"truncated header: {len(view)} bytes, need {HEADER_SIZE}")
    _, fmt, code, flags, dim, count, version = HEADER.unpack_from(view)
    model_version: int | None = None
    start = HEADER_SIZE
    if fmt == FORMAT_TAGGED:
        if len(view) < TAGGED_HEADER_SIZE:
            raise DecodeError(f"truncated tagged header: {len(view)} bytes, need 32")
        model_version, reserved = TAG.unpack_from(view, HEADER_SIZE)
        if model_version == 0:
            raise DecodeError("model version 0 in a tagged message (versions start at 1)")
        if reserved:
            raise DecodeError(f"reserved header field is {reserved}, must be 0")
        start = TAGGED_HEADER_SIZE
    elif fmt != FORMAT_VERSION:
        raise DecodeError(f"unsupported format version {fmt} (this reader knows 1 and 2)")
    if code not in DTYPE_CODES:
        raise DecodeError(f"unknown dtype code {code}")
    if flags & ~KNOWN_FLAGS:
        raise DecodeError(f"unknown flags 0x{flags:04x}")
    delete = bool(flags & FLAG_DELETE)
    if dim == 0 and not delete:
        raise DecodeError("dim is 0 in an upsert")
    dtype = DTYPE_CODES[code]
    value_bytes = 0 if delete else count * dim * dtype.itemsize
    expected = start + count * KEY_SIZE + value_bytes
    if len(view) != expected:
        what = "truncated" if len(view) < expected else "trailing bytes in"
        raise DecodeError(
            f"{what} message: {len(view)} bytes, header says {count} keys x dim {dim} "
            f"({'delete' if delete else dtype.name}) = {expected} bytes"
        )
    keys = np.frombuffer(view, dtype="<i8", count=count, offset=start)
    values = None
    if not delete:
        raw = np.frombuffer(view, dtype=dtype, count=count * dim, offset=start + 8 * count)
        values = raw.reshape(count, dim).astype(np.float32, copy=False)
    keys = keys.astype(np.int64, copy=False)
    return Decoded(keys, values, version, delete, dim, "native", model_version)


def _decode_hugectr(view: memoryview, timestamp_ns: int) -> Decoded:
    if len(view) < HUGECTR_HEADER_SIZE:
        raise DecodeError(f"truncated HugeCTR header: {len(view)} bytes, need 8")
    _, value_size = HUGECTR_HEADER.unpack_from(view)
    if value_size == 0 or value_size % 4:
        raise DecodeError(f"HugeCTR value size {value_size} is not a positive multiple of 4")
    body = len(view) - HUGECTR_HEADER_SIZE
    row = KEY_SIZE + value_size
    if body % row:
        raise DecodeError(
            f"truncated HugeCTR message: {body} payload bytes is not a whole number of "
            f"{row}-byte [key][value] pairs"
        )
    dim = value_size // 4
    if body == 0:  # HugeCTR's beacon: a header and nothing else
        return Decoded(
            np.empty(0, np.int64),
            np.empty((0, dim), np.float32),
            timestamp_ns,
            False,
            dim,
            "hugectr",
        )
    rows = np.frombuffer(view, dtype=_hugectr_row(value_size), offset=HUGECTR_HEADER_SIZE)
    keys = rows["key"].astype(np.int64)
    values = np.ascontiguousarray(rows["value"]).view("<f4").reshape(rows.size, dim)
    return Decoded(keys, values.astype(np.float32, copy=False), timestamp_ns, False, dim, "hugectr")

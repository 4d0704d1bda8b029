"""The wire decoders fuzzed with hypothesis: only the documented errors ever come out.

``codec.decode`` may raise :class:`DecodeError` (``VersionError`` included) and nothing
else; ``consumer.decode_message`` (topic, table, dimension, finiteness, version bound) may
raise :class:`FormatError` or :class:`RequestError`, which the consumer dead-letters. Inputs
are well-formed headers with hostile fields, valid messages with flipped bytes, truncated
or extended, and random bytes behind each magic.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hps.errors import DecodeError, FormatError, RequestError, VersionError
from hps.types import TableSpec
from hps.updates import codec
from hps.updates.consumer import decode_message

SPEC = TableSpec("m", "t", 3)
TABLES = {SPEC.name: SPEC}
U32 = st.integers(0, 2**32 - 1)
RECEIPT_NS = 1_000_000_000_000 * 1_000_000  # the consumer's clock in these tests: ts_ms 10^12


class Msg:
    def __init__(self, topic: str, value: bytes | None, key: bytes | None, ts: int) -> None:
        self._topic, self._value, self._key, self._ts = topic, value, key, ts

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def partition(self) -> int:
        return 0


def _valid(rng: np.random.Generator, n: int, dim: int, version: int, kind: int) -> bytes:
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    if kind == 0:
        return codec.encode(keys, values, version)
    if kind == 1:
        return codec.encode(keys, None, version, delete=True)
    if kind == 2:
        return codec.encode(keys, values, version, dtype="<f2")
    return codec.encode_hugectr(keys, values)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message of either format, then bytes flipped, cut or appended."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    payload = bytearray(
        _valid(
            rng,
            draw(st.integers(0, 20)),
            draw(st.integers(1, 6)),
            draw(st.integers(0, 2**64 - 1)),
            draw(st.integers(0, 3)),
        )
    )
    for _ in range(draw(st.integers(0, 4))):
        if payload:
            at = draw(st.integers(0, len(payload) - 1))
            payload[at] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(payload)))
    tail = draw(st.binary(max_size=16))
    return bytes(payload[:cut] if draw(st.booleans()) else payload) + tail


@st.composite
def hostile_header(draw: st.DrawFn) -> bytes:
    """A native header with any field values, and a body of any length up to what it claims."""
    head = codec.HEADER.pack(
        b"HPSU",
        draw(st.integers(0, 255)),
        draw(st.integers(0, 255)),
        draw(st.integers(0, 2**16 - 1)),
        draw(st.one_of(st.integers(0, 8), U32)),
        draw(st.one_of(st.integers(0, 8), U32)),
        draw(st.integers(0, 2**64 - 1)),
    )
    return head + draw(st.binary(max_size=300))


@st.composite
def hostile_hugectr(draw: st.DrawFn) -> bytes:
    value_size = draw(st.one_of(st.integers(0, 40), U32))
    return struct.pack("<4sI", b"HCTR", value_size) + draw(st.binary(max_size=300))


PAYLOADS = st.one_of(
    mutated(), hostile_header(), hostile_hugectr(), st.binary(max_size=200), st.none()
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS, st.integers(-(2**40), 2**45), st.booleans())
def test_decode_raises_only_decode_errors(payload: bytes | None, ts_ns: int, keyed: bool) -> None:
    try:
        d = codec.decode(payload, timestamp_ns=max(ts_ns, 0), has_key=keyed)
    except DecodeError:
        return
    assert d.keys.dtype == np.int64 and d.keys.ndim == 1
    if d.values is not None:
        assert d.values.dtype == np.float32 and d.values.shape == (d.keys.size, d.dim)
    assert 0 <= d.version < 2**64


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    PAYLOADS,
    st.sampled_from(["hps_et.m.t", "hps_et.m.u", "hps_et.m", "other", "hps_et.m.t.x", ""]),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.integers(-1, 2**42),
    st.floats(0, 1e6),
)
def test_decode_message_raises_only_documented_errors(
    payload: bytes | None, topic: str, key: bytes | None, ts_ms: int, ahead_s: float
) -> None:
    receipt_ns = RECEIPT_NS
    try:
        upd = decode_message(
            Msg(topic, payload, key, ts_ms),
            TABLES,
            max_version_ahead_s=ahead_s,
            receipt_ns=receipt_ns,
        )
    except (FormatError, RequestError):
        return
    # whatever the producer put in the timestamp, the consumer's clock bounds the version
    assert upd.version <= receipt_ns + int(ahead_s * 1e9)
    assert upd.table == SPEC.name
    if upd.values is not None and upd.keys.size:  # an empty message applies nothing
        assert upd.values.shape == (upd.keys.size, SPEC.dim) and np.isfinite(upd.values).all()
    if ts_ms > 0:
        assert upd.version <= ts_ms * 1_000_000 + int(ahead_s * 1e9)


FAR_NS = 1_790_000_000_000_000_000 + 50 * 365 * 86400 * 10**9  # 50 years after "now" below
NOW_NS = 1_790_000_000_000_000_000


@pytest.mark.parametrize(
    ("payload", "ts_ns"),
    [
        (codec.encode(np.array([1]), np.ones((1, 3), np.float32), FAR_NS), FAR_NS),  # both
        (codec.encode(np.array([1]), np.ones((1, 3), np.float32), 2**64 - 1), 0),  # no ts
        (codec.encode_hugectr(np.array([1]), np.ones((1, 3), np.float32)), FAR_NS),  # HugeCTR
    ],
    ids=["native-version-and-timestamp", "native-without-timestamp", "hugectr-timestamp"],
)
def test_a_forged_future_cannot_pass_the_consumer_clock(payload: bytes, ts_ns: int) -> None:
    msg = Msg("hps_et.m.t", payload, None, ts_ns // 1_000_000)
    with pytest.raises(VersionError, match="ahead of the consumer's clock at receipt"):
        decode_message(msg, TABLES, receipt_ns=NOW_NS)


def test_honest_and_replayed_versions_pass() -> None:
    values = np.ones((1, 3), np.float32)
    within = NOW_NS + 299 * 10**9  # a producer clock 299 s ahead, under the 300 s default
    msg = Msg("hps_et.m.t", codec.encode(np.array([1]), values, within), None, within // 10**6)
    assert decode_message(msg, TABLES, receipt_ns=NOW_NS).version == within
    old = NOW_NS - 3 * 86400 * 10**9  # replayed three days later
    msg = Msg("hps_et.m.t", codec.encode_hugectr(np.array([1]), values), None, old // 10**6)
    assert decode_message(msg, TABLES, receipt_ns=NOW_NS).version == old


def test_an_earlier_timestamp_tightens_the_bound() -> None:
    """A LogAppendTime (or the producer's own CreateTime) earlier than the consumer's clock
    bounds the version too."""
    ts = NOW_NS - 3600 * 10**9
    payload = codec.encode(np.array([1]), np.ones((1, 3), np.float32), ts + 301 * 10**9)
    with pytest.raises(VersionError, match="ahead of the message timestamp"):
        decode_message(Msg("hps_et.m.t", payload, None, ts // 10**6), TABLES, receipt_ns=NOW_NS)

"""The update wire format: round trips, HugeCTR's layout, and bad payloads as DecodeError."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hps.errors import DecodeError, InvalidValueError
from hps.updates import codec

keys_st = hnp.arrays(np.int64, st.integers(0, 64), elements=st.integers(-(2**63), 2**63 - 1))


@settings(max_examples=60, deadline=None)
@given(keys=keys_st, dim=st.integers(1, 9), version=st.integers(0, 2**64 - 1), data=st.data())
def test_native_round_trip(keys: np.ndarray, dim: int, version: int, data: st.DataObject) -> None:
    values = data.draw(
        hnp.arrays(np.float32, (keys.size, dim), elements=st.floats(-1e6, 1e6, width=32))
    )
    d = codec.decode(codec.encode(keys, values, version))
    assert d.format == "native" and not d.delete and d.version == version and d.dim == dim
    assert d.keys.dtype == np.int64 and d.values is not None and d.values.dtype == np.float32
    np.testing.assert_array_equal(d.keys, keys)
    np.testing.assert_array_equal(d.values, values)


@settings(max_examples=30, deadline=None)
@given(keys=keys_st, version=st.integers(0, 2**64 - 1))
def test_delete_round_trip(keys: np.ndarray, version: int) -> None:
    payload = codec.encode(keys, None, version, delete=True)
    assert len(payload) == codec.HEADER_SIZE + 8 * keys.size
    d = codec.decode(payload)
    assert d.delete and d.values is None and d.version == version
    np.testing.assert_array_equal(d.keys, keys)


@settings(max_examples=30, deadline=None)
@given(keys=keys_st, dim=st.integers(1, 6), ts=st.integers(0, 2**62))
def test_hugectr_round_trip(keys: np.ndarray, dim: int, ts: int) -> None:
    values = np.arange(keys.size * dim, dtype=np.float32).reshape(keys.size, dim) - 3.5
    d = codec.decode(codec.encode_hugectr(keys, values), timestamp_ns=ts)
    assert d.format == "hugectr" and d.version == ts and d.dim == dim and not d.delete
    np.testing.assert_array_equal(d.keys, keys)
    np.testing.assert_array_equal(d.values, values)


def test_native_header_layout_byte_by_byte() -> None:
    payload = codec.encode(np.array([7, -1]), np.array([[1.0, 2.0], [3.0, 4.0]]), 0x0102030405)
    assert payload[:4] == b"HPSU"
    assert payload[4] == 1 and payload[5] == 1  # format version, dtype float32
    assert struct.unpack_from("<HII", payload, 6) == (0, 2, 2)  # flags, dim, count
    assert struct.unpack_from("<Q", payload, 16) == (0x0102030405,)
    assert struct.unpack_from("<qq", payload, 24) == (7, -1)
    assert struct.unpack_from("<4f", payload, 40) == (1.0, 2.0, 3.0, 4.0)
    assert len(payload) == 56


def test_hugectr_layout_matches_the_sink() -> None:
    """Bytes as HugeCTR's KafkaMessageSink wrote them: 'HCTR', value size, [key][value]..."""
    vals = np.array([[1.5, -2.0, 0.25]], dtype=np.float32)
    raw = b"HCTR" + struct.pack("<I", 12) + struct.pack("<q", 42) + vals.tobytes()
    assert codec.encode_hugectr(np.array([42]), vals) == raw
    d = codec.decode(raw, timestamp_ns=5)
    assert d.keys.tolist() == [42] and d.values is not None
    np.testing.assert_array_equal(d.values, vals)


def test_hugectr_beacon_is_empty() -> None:
    d = codec.decode(b"HCTR" + struct.pack("<I", 8))
    assert d.keys.size == 0 and d.values is not None and d.values.shape == (0, 2)


def test_float16_values_widen_to_float32() -> None:
    values = np.array([[0.5, 1.5]], dtype=np.float16)
    d = codec.decode(codec.encode(np.array([1]), values, 3, dtype="<f2"))
    assert d.values is not None and d.values.dtype == np.float32
    np.testing.assert_array_equal(d.values, [[0.5, 1.5]])


GOOD = codec.encode(np.arange(3), np.ones((3, 4), np.float32), 9)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "unknown magic"),
        (b"ZZZZ" + GOOD[4:], "unknown magic"),
        (GOOD[:10], "truncated header"),
        (GOOD[:-1], "truncated message"),
        (GOOD + b"\0", "trailing bytes"),
        (GOOD[:4] + b"\x03" + GOOD[5:], "format version"),
        (GOOD[:5] + b"\x09" + GOOD[6:], "dtype code"),
        (GOOD[:6] + b"\x02\x00" + GOOD[8:], "unknown flags"),
        (GOOD[:8] + struct.pack("<I", 0) + GOOD[12:], "dim is 0"),
        (GOOD[:12] + struct.pack("<I", 4) + GOOD[16:], "truncated message"),
        (b"HCTR\x00", "truncated HugeCTR header"),
        (b"HCTR" + struct.pack("<I", 6), "multiple of 4"),
        (b"HCTR" + struct.pack("<I", 8) + b"\0" * 15, "truncated HugeCTR message"),
    ],
)
def test_bad_payloads_raise_decode_error(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        codec.decode(payload)


def test_tombstone_and_keyed_hugectr_are_rejected() -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        codec.decode(None)
    with pytest.raises(DecodeError, match="Kafka key"):
        codec.decode(codec.encode_hugectr(np.array([1]), np.ones((1, 2))), has_key=True)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(payload: bytes) -> None:
    for prefix in (b"", b"HPSU", b"HCTR", GOOD[:24]):
        try:
            d = codec.decode(prefix + payload)
        except DecodeError:
            continue
        assert d.keys.dtype == np.int64
        assert d.values is None or d.values.shape == (d.keys.size, d.dim)


def test_topic_names() -> None:
    assert codec.topic_name("m_1", "t-2") == "hps_et.m_1.t-2"
    assert codec.parse_topic("hps_et.m_1.t-2") == ("m_1", "t-2")
    for bad in ("hps_et.dead_letter", "other.m.t", "hps_et.m.t.x", "hps_et..t"):
        with pytest.raises(DecodeError):
            codec.parse_topic(bad)


@pytest.mark.parametrize(("model", "table", "bad"), [
    ("pm.x", "t0", "model 'pm.x'"), ("p m", "t0", "model 'p m'"), ("pm", "", "table ''"),
    ("pm", "x.t0", "table 'x.t0'"), ("", "t0", "model ''"), ("pm", "t0\n", "table 't0\\n'"),
])  # fmt: skip
def test_a_topic_no_consumer_reads_is_refused(model: str, table: str, bad: str) -> None:
    """parse_topic never matches such a name: every update sent to it would be lost."""
    with pytest.raises(InvalidValueError, match=re.escape(bad) + r" .*\[A-Za-z0-9_-\]\+"):
        codec.topic_name(model, table)


def test_encode_rejects_inconsistent_input() -> None:
    with pytest.raises(ValueError):
        codec.encode(np.arange(2), np.ones((3, 2)), 1)
    with pytest.raises(ValueError):
        codec.encode(np.arange(2), None, 1)
    with pytest.raises(ValueError):
        codec.encode(np.arange(2), np.ones((2, 2)), -1)


def test_a_tagged_message_carries_its_model_version() -> None:
    keys, values = np.array([7, -1]), np.array([[1.0, 2.0], [3.0, 4.0]])
    payload = codec.encode(keys, values, 0x0102030405, model_version=9)
    assert payload[4] == 2  # format version 2: tagged
    assert struct.unpack_from("<Q", payload, 16) == (0x0102030405,)  # update version
    assert struct.unpack_from("<II", payload, 24) == (9, 0)  # model version, reserved
    assert struct.unpack_from("<qq", payload, 32) == (7, -1)
    assert len(payload) == 32 + 16 + 16
    d = codec.decode(payload)
    assert (d.model_version, d.version, d.format) == (9, 0x0102030405, "native")
    np.testing.assert_array_equal(d.values, values)
    rm = codec.decode(codec.encode(keys, None, 3, delete=True, model_version=2))
    assert rm.delete and rm.model_version == 2 and rm.values is None


def test_untagged_and_hugectr_messages_decode_as_before() -> None:
    """Format 1 is still what an untagged publisher writes, byte for byte, and it and
    HugeCTR's messages decode with no model version."""
    assert codec.encode(np.array([1]), np.ones((1, 2)), 5)[4] == 1
    assert codec.decode(GOOD).model_version is None
    hctr = codec.encode_hugectr(np.array([1]), np.ones((1, 2)))
    assert codec.decode(hctr, timestamp_ns=4).model_version is None


TAGGED = codec.encode(np.arange(3), np.ones((3, 4), np.float32), 9, model_version=3)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (TAGGED[:28], "truncated tagged header"),
        (TAGGED[:24] + struct.pack("<II", 0, 0) + TAGGED[32:], "model version 0"),
        (TAGGED[:24] + struct.pack("<II", 3, 1) + TAGGED[32:], "reserved"),
        (TAGGED[:-4], "truncated message"),
    ],
)
def test_bad_tagged_payloads_raise_decode_error(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        codec.decode(payload)


@pytest.mark.parametrize("bad", [0, -1, 2**32])
def test_model_versions_outside_uint32_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="model version"):
        codec.encode(np.array([1]), np.ones((1, 2)), 1, model_version=bad)

"""Dead letters within the producer's and the broker's size limits, with the real
librdkafka producer (its own size check at produce time needs no broker: the broker here is
a loopback port nobody listens on) and a stand-in for a broker that refuses letters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hps.errors import BackendUnavailable
from hps.net import free_port
from hps.updates import deadletter
from hps.updates.deadletter import DeadLetters, fitted, letter_size


class Msg:
    """An update message as the consumer hands it to the dead-letter topic."""

    def __init__(self, key: bytes | None, value: bytes | None) -> None:
        self._k, self._v = key, value

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def topic(self) -> str:
        return "hps_et.m.t"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 41

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


class Recording:
    """Wraps a producer: records what is produced (key, value, headers), then hands it on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.produced: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []

    def produce(self, topic: str, value: Any, key: Any, **kw: Any) -> None:
        self.produced.append((key, value, dict(kw["headers"])))
        self.inner.produce(topic, value, key, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def make_letters(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., DeadLetters]]:
    monkeypatch.setattr(deadletter, "ensure_topics", lambda *a, **kw: {})
    made: list[DeadLetters] = []

    def make(**config: Any) -> DeadLetters:
        conf = {"reconnect.backoff.ms": 10, **config}
        dl = DeadLetters(f"127.0.0.1:{free_port()}", "dead", conf)
        dl._producer = Recording(dl._producer)  # type: ignore[assignment]
        made.append(dl)
        return dl

    yield make
    for dl in made:  # nothing can be delivered: drop what is queued instead of waiting
        dl._producer.purge()


def produced(dl: DeadLetters) -> list[tuple[bytes | None, bytes | None, dict[str, bytes]]]:
    return dl._producer.produced  # type: ignore[attr-defined, no-any-return]


def test_a_large_key_makes_the_letter_go_without_its_payload(
    make_letters: Callable[..., DeadLetters],
) -> None:
    """The audit's message: a 600,000-byte key and a 399,964-byte payload, which the
    producer's 1,000,000 bytes hold exactly; with the headers the letter was refused at
    produce time, its batch retried for ever."""
    dl = make_letters()
    assert dl.max_bytes == 1_000_000  # librdkafka's default message.max.bytes
    dl.send(Msg(b"k" * 600_000, b"X" * 399_964), "DecodeError: unknown magic")  # type: ignore[arg-type]
    ((key, value, headers),) = produced(dl)
    assert key == b"k" * 600_000 and value is None
    assert headers["hps_payload_bytes"] == b"399964" and "hps_key_bytes" not in headers
    assert headers["hps_reason"] == b"DecodeError: unknown magic"


def test_a_key_near_the_limit_goes_too(make_letters: Callable[..., DeadLetters]) -> None:
    dl = make_letters()
    dl.send(Msg(b"k" * 999_800, b"X" * 100), "DecodeError: truncated")  # type: ignore[arg-type]
    ((key, value, headers),) = produced(dl)
    assert key is None and value is None
    assert headers["hps_payload_bytes"] == b"100" and headers["hps_key_bytes"] == b"999800"
    assert headers["hps_offset"] == b"41" and headers["hps_partition"] == b"3"


def test_the_limit_is_the_producers_message_max_bytes(
    make_letters: Callable[..., DeadLetters],
) -> None:
    dl = make_letters(**{"message.max.bytes": 20_000})
    assert dl.max_bytes == 20_000
    dl.send(Msg(b"key", b"X" * 30_000), "ShapeError: dim 5, table dim 4")  # type: ignore[arg-type]
    dl.send(Msg(None, b"X" * 10_000), "ShapeError: dim 5, table dim 4")  # type: ignore[arg-type]
    (key, value, headers), (_, small, _) = produced(dl)
    assert key == b"key" and value is None and headers["hps_payload_bytes"] == b"30000"
    assert small == b"X" * 10_000  # what fits is carried whole


def test_a_letter_the_producer_refuses_for_its_size_is_sent_bare(
    make_letters: Callable[..., DeadLetters],
) -> None:
    """Should the estimate let through a letter librdkafka refuses (MSG_SIZE_TOO_LARGE at
    produce time), it goes without payload and key instead of failing the batch."""
    dl = make_letters()
    dl.max_bytes = 10_000_000  # an estimate librdkafka disagrees with
    dl.send(Msg(b"k" * 600_000, b"X" * 399_964), "DecodeError: unknown magic")  # type: ignore[arg-type]
    first, (key, value, headers) = produced(dl)
    assert first[0] is not None and first[1] is not None  # tried whole, refused
    assert key is None and value is None
    assert headers["hps_payload_bytes"] == b"399964" and headers["hps_key_bytes"] == b"600000"


class SizeError:
    """librdkafka's error for a message over a size limit, as a delivery report gives it."""

    def name(self) -> str:
        return "MSG_SIZE_TOO_LARGE"

    def str(self) -> str:
        return "Broker: Message size too large"


class RefusingBroker:
    """A producer whose broker (a dead-letter topic's max.message.bytes) refuses every
    letter over ``limit`` bytes in its delivery report."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued: list[tuple[int, Callable[[Any, Any], None]]] = []
        self.delivered: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []

    def produce(self, topic: str, value: Any, key: Any, *, headers: Any, on_delivery: Any) -> None:
        size = letter_size(key, value, headers)
        self.queued.append((size, on_delivery))
        if size <= self.limit:
            self.delivered.append((key, value, dict(headers)))

    def flush(self, timeout: float) -> int:
        queued, self.queued = self.queued, []
        for size, report in queued:
            report(SizeError() if size > self.limit else None, None)
        return 0

    def poll(self, timeout: float) -> int:
        return 0

    def purge(self) -> None:
        self.queued = []


def test_a_letter_the_broker_refuses_for_its_size_is_sent_again_bare(
    make_letters: Callable[..., DeadLetters],
) -> None:
    dl = make_letters()
    dl._producer.purge()
    broker = RefusingBroker(limit=50_000)
    dl._producer = broker  # type: ignore[assignment]
    dl.send(Msg(b"k" * 100, b"X" * 60_000), "DecodeError: truncated")  # type: ignore[arg-type]
    dl.send(Msg(None, b"X" * 10), "DecodeError: truncated")  # type: ignore[arg-type]
    dl.flush()  # no error: the batch goes on
    small, (key, value, headers) = broker.delivered
    assert small[1] == b"X" * 10
    assert key is None and value is None
    assert headers["hps_payload_bytes"] == b"60000" and headers["hps_key_bytes"] == b"100"
    assert dl.sent == 2


def test_a_bare_letter_still_refused_fails_the_batch(
    make_letters: Callable[..., DeadLetters],
) -> None:
    dl = make_letters()
    dl._producer.purge()
    dl._producer = RefusingBroker(limit=10)  # type: ignore[assignment]
    dl.send(Msg(b"k", b"X"), "DecodeError: truncated")  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailable, match="MSG_SIZE_TOO_LARGE"):
        dl.flush()


def test_fitted_keeps_what_fits_and_names_what_it_left_out() -> None:
    heads: deadletter.Headers = [("hps_reason", b"r")]
    whole = fitted(b"k" * 10, b"v" * 10, heads, 1000)
    assert (whole.key, whole.payload, whole.headers) == (b"k" * 10, b"v" * 10, heads)
    big = deadletter.MAX_PAYLOAD_BYTES + 1
    no_payload = fitted(None, b"v" * big, heads, 10_000_000)  # over the payload cap
    assert no_payload.payload is None
    assert dict(no_payload.headers)["hps_payload_bytes"] == str(big).encode()
    no_value = fitted(b"k" * 850, b"v" * 100, heads, 1000)
    assert no_value.key == b"k" * 850 and no_value.headers[-1] == ("hps_payload_bytes", b"100")
    for letter in (whole, no_payload, fitted(b"k" * 2000, b"v", heads, 1000)):
        assert letter.size <= 1000 or letter.key is None and letter.payload is None

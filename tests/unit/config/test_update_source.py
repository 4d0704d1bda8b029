"""``update_source`` settings refused at config load."""

from __future__ import annotations

import pytest

from hps.config import parse_config
from hps.errors import ConfigError

MODELS = [{"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2]}]


def _load(**update_source: object) -> object:
    doc = {"models": MODELS, "update_source": {"type": "kafka", **update_source}}
    return parse_config(doc, "ps.json")


@pytest.mark.parametrize("topic", ["hps_et.m.t", "hps_et.other.t0", "hps_et.dead.letters"])
def test_a_dead_letter_topic_named_like_an_update_topic_is_refused(topic: str) -> None:
    """A consumer of that topic would read its dead letters back and send them there
    again, for ever."""
    with pytest.raises(ConfigError, match=r"update_source\.hps_dead_letter_topic: .*update topic"):
        _load(hps_dead_letter_topic=topic)


@pytest.mark.parametrize("topic", ["hps_et.dead_letter", "dead.m", "hps_dead_letter", ""])
def test_other_dead_letter_topics_are_taken(topic: str) -> None:
    assert _load(hps_dead_letter_topic=topic).update_source.hps_dead_letter_topic == topic  # type: ignore[attr-defined]


@pytest.mark.parametrize("topic", ["bad topic", "dead/letters", ".", "..", "x" * 250, "dlq\n"])
def test_a_dead_letter_topic_no_broker_takes_is_refused(topic: str) -> None:
    """Refused at load, not by the broker on the first bad message."""
    with pytest.raises(ConfigError, match=r"hps_dead_letter_topic: .*is no Kafka topic name"):
        _load(hps_dead_letter_topic=topic)


@pytest.mark.parametrize("key", ["poll_timeout_ms", "failure_backoff_ms"])
def test_a_zero_wait_is_refused(key: str) -> None:
    """0 made an idle consumer spin on its polls, or a tier outage a hot retry loop that
    flooded the log."""
    with pytest.raises(ConfigError, match=rf"update_source\.{key}: .*greater than or equal to 1"):
        _load(**{key: 0})


@pytest.mark.parametrize("key", ["poll_timeout_ms", "failure_backoff_ms"])
def test_a_one_millisecond_wait_is_taken(key: str) -> None:
    assert getattr(_load(**{key: 1}).update_source, key) == 1  # type: ignore[attr-defined]

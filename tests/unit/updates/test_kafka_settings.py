"""Kafka client settings checked once at start (librdkafka, no broker), secrets kept out."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.errors import ConfigError
from hps.updates.kafka import _hide_values, check_settings, check_update_source
from tests.helpers import make_config

pytest.importorskip("confluent_kafka")

SECRET = "keystore-secret-value-1"


def test_valid_settings_pass_without_a_broker() -> None:
    check_settings(
        {
            "ssl.keystore.password": SECRET,
            "sasl.oauthbearer.config": "clientSecret=abc123456",
            "session.timeout.ms": 2000,  # a consumer's setting: fine here too
            "enable.auto.commit": False,
            "acks": "all",
        },
        "ps.json: update_source.hps_kafka_config",
    )


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"ssl.keystore.pasword": SECRET}, ["No such configuration property", "pasword"]),
        ({"session.timeout.ms": "soon"}, ["Invalid value", "session.timeout.ms"]),
        ({"batch.size": -5}, ["batch.size", "outside allowed range"]),
        (
            {"security.protocol": "SSL", "ssl.keystore.location": "/nonexistent.p12",
             "ssl.keystore.password": SECRET},
            ["ssl.keystore.location", "/nonexistent.p12"],
        ),
    ],
)  # fmt: skip
def test_a_bad_setting_is_a_config_error_naming_it(
    settings: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        check_settings(settings, "ps.json: update_source.hps_kafka_config")
    message = str(err.value)
    assert message.startswith("ps.json: update_source.hps_kafka_config: ")
    assert all(w in message for w in words), message
    assert SECRET not in message


def test_secret_values_are_hidden_from_librdkafka_messages() -> None:
    settings = {"sasl.password": SECRET, "sasl.jaas.config": "pw", "acks": "x"}
    text = f'Configuration property "sasl.password" value {SECRET} is bad'
    assert SECRET not in _hide_values(text, settings) and "<redacted>" in _hide_values(
        text, settings
    )
    # a value too short to scrub from free text: the message then names the setting only
    short = _hide_values('"sasl.jaas.config" value pw is bad', settings)
    assert short == (
        "invalid setting 'sasl.jaas.config' (the message is withheld: it shows "
        "'sasl.jaas.config''s <redacted> value)"
    )
    # one about another setting names that one, not the secret's
    tls = {**settings, "ssl.ca.location": "/x/pw/ca.crt"}
    other = _hide_values('"ssl.ca.location": no such file: /x/pw/ca.crt', tls)
    assert other.startswith("invalid setting 'ssl.ca.location' (") and "pw" not in other
    assert _hide_values('Invalid value "x" for "acks"', settings) == 'Invalid value "x" for "acks"'


def test_update_source_is_checked_only_when_enabled(tmp_path: Path) -> None:
    bad = {"hps_kafka_config": {"sasl.oauthbearer.confg": SECRET}}
    check_update_source(make_config(tmp_path, update_source={"type": "null", **bad}))
    config = make_config(tmp_path, update_source={"type": "kafka", **bad})
    with pytest.raises(ConfigError, match="test-ps.json: update_source.hps_kafka_config: No"):
        check_update_source(config)


def test_creating_topics_on_a_broker_that_is_down_writes_no_raw_driver_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from hps.errors import BackendError
    from hps.net import free_port
    from hps.updates.kafka import ensure_topics

    with pytest.raises(BackendError, match="creating topics"):
        ensure_topics(f"127.0.0.1:{free_port()}", ["hps_et.m.t"], timeout_s=1.0)
    assert "|FAIL|" not in capfd.readouterr().err  # librdkafka's own stderr format

"""Secrets named by environment variable in ps.json (hps_password_env, hps_kafka_config_env)."""

from __future__ import annotations

import pytest

from hps.config import parse_config
from hps.errors import ConfigError

MODELS = [{"model": "m", "embedding_vecsize_per_table": [4]}]


def test_redis_password_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPS_REDIS_PASSWORD", "s3cret")
    config = parse_config(
        {
            "models": MODELS,
            "volatile_db": {"type": "redis", "hps_password_env": "HPS_REDIS_PASSWORD"},
        }
    )
    assert config.volatile_db.password == "s3cret"


def test_kafka_secrets_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPS_KAFKA_SASL_PASSWORD", "pw")
    us = {
        "type": "kafka",
        "hps_kafka_config": {"sasl.username": "hps"},
        "hps_kafka_config_env": {"sasl.password": "HPS_KAFKA_SASL_PASSWORD"},
    }
    config = parse_config({"models": MODELS, "update_source": us})
    assert config.update_source.hps_kafka_config == {"sasl.username": "hps", "sasl.password": "pw"}


@pytest.mark.parametrize(
    ("section", "value", "words"),
    [
        (
            "volatile_db",
            {"hps_password_env": "HPS_MISSING"},
            ["volatile_db", "HPS_MISSING", "not set"],
        ),
        (
            "update_source",
            {"hps_kafka_config_env": {"sasl.password": "HPS_MISSING"}},
            ["update_source", "hps_kafka_config_env.sasl.password", "HPS_MISSING"],
        ),
        (
            "volatile_db",
            {"hps_password_env": "not a name"},
            ["'not a name'", "environment variable"],
        ),
    ],
)
def test_missing_or_bad_variable(
    monkeypatch: pytest.MonkeyPatch, section: str, value: dict, words: list[str]
) -> None:
    monkeypatch.delenv("HPS_MISSING", raising=False)
    with pytest.raises(ConfigError) as err:
        parse_config({"models": MODELS, section: value}, "ps.json")
    for word in ["ps.json", *words]:
        assert word in str(err.value)

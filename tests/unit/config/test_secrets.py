"""Secrets named by environment variable in ps.json (hps_password_env, hps_kafka_config_env).

A variable ``NAME`` holds the secret itself, or ``NAME_FILE`` names a file holding it (a
mounted Kubernetes or Compose secret, what the chart uses).
"""

from __future__ import annotations

from pathlib import Path

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


def secret_file(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    return path


def test_redis_password_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HPS_REDIS_PASSWORD", raising=False)
    # kubectl create secret --from-file keeps the file's trailing newline: not the password's
    path = secret_file(tmp_path, "password", "s3cret with spaces \n")
    monkeypatch.setenv("HPS_REDIS_PASSWORD_FILE", str(path))
    config = parse_config(
        {
            "models": MODELS,
            "volatile_db": {"type": "redis", "hps_password_env": "HPS_REDIS_PASSWORD"},
        }
    )
    assert config.volatile_db.password == "s3cret with spaces "


def test_kafka_secrets_from_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HPS_KAFKA_SASL_PASSWORD", "HPS_KAFKA_SSL_KEY_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(
        "HPS_KAFKA_SASL_PASSWORD_FILE", str(secret_file(tmp_path, "sasl.password", "pw"))
    )
    monkeypatch.setenv(
        "HPS_KAFKA_SSL_KEY_PASSWORD_FILE", str(secret_file(tmp_path, "ssl.key.password", "kp\n"))
    )
    us = {
        "type": "kafka",
        "hps_kafka_config": {"sasl.username": "hps"},
        "hps_kafka_config_env": {
            "sasl.password": "HPS_KAFKA_SASL_PASSWORD",
            "ssl.key.password": "HPS_KAFKA_SSL_KEY_PASSWORD",
        },
    }
    config = parse_config({"models": MODELS, "update_source": us})
    assert config.update_source.hps_kafka_config == {
        "sasl.username": "hps",
        "sasl.password": "pw",
        "ssl.key.password": "kp",
    }


def test_a_variable_and_its_file_together_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HPS_REDIS_PASSWORD", "value-in-env")
    monkeypatch.setenv("HPS_REDIS_PASSWORD_FILE", str(secret_file(tmp_path, "pw", "value-in-file")))
    with pytest.raises(ConfigError) as err:
        parse_config(
            {"models": MODELS, "volatile_db": {"hps_password_env": "HPS_REDIS_PASSWORD"}},
            "ps.json",
        )
    message = str(err.value)
    assert "HPS_REDIS_PASSWORD or HPS_REDIS_PASSWORD_FILE, not both" in message
    assert "value-in-env" not in message and "value-in-file" not in message


def test_an_unreadable_file_is_a_config_error_without_its_content(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HPS_KAFKA_SASL_PASSWORD", raising=False)
    missing = tmp_path / "absent"
    monkeypatch.setenv("HPS_KAFKA_SASL_PASSWORD_FILE", str(missing))
    us = {"type": "kafka", "hps_kafka_config_env": {"sasl.password": "HPS_KAFKA_SASL_PASSWORD"}}
    with pytest.raises(ConfigError) as err:
        parse_config({"models": MODELS, "update_source": us}, "ps.json")
    message = str(err.value)
    for word in ["ps.json", "hps_kafka_config_env.sasl.password", "HPS_KAFKA_SASL_PASSWORD_FILE"]:
        assert word in message
    assert str(missing) in message and "No such file" in message

    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe secret-bytes")
    monkeypatch.setenv("HPS_KAFKA_SASL_PASSWORD_FILE", str(binary))
    with pytest.raises(ConfigError) as err:
        parse_config({"models": MODELS, "update_source": us}, "ps.json")
    assert "not UTF-8 text" in str(err.value) and "secret-bytes" not in str(err.value)

"""hps.redact: secret names by pattern, registered values scrubbed from text and log records."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from hps import redact
from hps.redact import REDACTED


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    """Each test starts with no registered secret and leaves none behind."""
    with redact._lock:
        saved = set(redact._values)
        redact._values.clear()
    yield
    with redact._lock:
        redact._values.clear()
        redact._values.update(saved)


@pytest.mark.parametrize(
    "name",
    [
        "password",  # *password*
        "volatile_db_password",
        "ssl.keystore.password",
        "ssl.key.password",
        "sasl.password",
        "PASSWORD",
        "sasl.oauthbearer.client.secret",  # *secret*
        "client_secret",
        "ssl.key.pem",  # *.key.pem
        "sasl.oauthbearer.config",  # sasl.*config
        "sasl.jaas.config",
        "sasl.kerberos.config",
        "HPS_ADMIN_TOKEN",  # *token*
        "access_token",
        "HPS_ADMIN_KEY",
        "sasl.oauthbearer.assertion.private.key.passphrase",  # *passphrase*
        "sasl.oauthbearer.assertion.private.key.pem",  # *private.key*
        "private_key",
    ],
)
def test_secret_names(name: str) -> None:
    assert redact.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "user_name",
        "sasl.username",
        "sasl.mechanism",
        "ssl.certificate.pem",
        "ssl.ca.location",
        "ssl.keystore.location",
        "tls_client_key",  # a path to a key file
        "security.protocol",
        "acks",
        "brokers",
        "address",
        # where a secret is kept, not the secret
        "hps_password_env",
        "HPS_ADMIN_TOKEN_FILE",
        "HPS_ADMIN_KEY_FILE",
        "hps_kafka_config_env",
    ],
)
def test_other_names(name: str) -> None:
    assert not redact.is_secret_name(name)


def test_redact_mapping_nested_dicts_and_lists() -> None:
    doc = {
        "volatile_db": {"password": "redis-pass-1", "user_name": "u", "hps_password_env": "PW"},
        "update_source": {
            "hps_kafka_config": {
                "ssl.keystore.password": "keystore-pw-2",
                "sasl.oauthbearer.config": "clientSecret=oauth-3",
                "sasl.jaas.config": {"nested": "jaas-secret-4"},
                "acks": "all",
            },
            "hps_kafka_config_env": {"sasl.password": "KAFKA_PW"},
        },
        "clients": [{"token": "list-token-5", "name": "a"}, ["plain", {"secret": ["x", "y"]}]],
        "empty": {"password": "", "token": None},
        "url": "redis://u:redis-pass-1@host:6379",
        "count": 3,
    }
    out = redact.redact_mapping(doc)
    assert out["volatile_db"] == {"password": REDACTED, "user_name": "u", "hps_password_env": "PW"}
    kafka = out["update_source"]["hps_kafka_config"]
    assert kafka == {
        "ssl.keystore.password": REDACTED,
        "sasl.oauthbearer.config": REDACTED,
        "sasl.jaas.config": REDACTED,
        "acks": "all",
    }
    # the env variable's name is not the secret
    assert out["update_source"]["hps_kafka_config_env"] == {"sasl.password": "KAFKA_PW"}
    assert out["clients"] == [{"token": REDACTED, "name": "a"}, ["plain", {"secret": REDACTED}]]
    assert out["empty"] == {"password": "", "token": None}
    # a registered value is scrubbed from other strings (a password inside a URL)
    assert out["url"] == f"redis://u:{REDACTED}@host:6379"
    assert out["count"] == 3
    assert doc["volatile_db"]["password"] == "redis-pass-1"  # the input is not changed
    # what was found is registered for the logs
    assert {
        "redis-pass-1",
        "keystore-pw-2",
        "clientSecret=oauth-3",
        "jaas-secret-4",
        "list-token-5",
    } <= redact.registered()


def test_scrub_registered_and_extra_values() -> None:
    redact.register("the-admin-key-123", None, "", "short")
    assert "short" not in redact.registered()  # too short to scrub from free text
    assert redact.scrub("key=the-admin-key-123;") == f"key={REDACTED};"
    assert redact.scrub("a short text") == "a short text"
    assert redact.scrub("x extra-value y", extra=["extra-value"]) == f"x {REDACTED} y"
    # longest first: a secret containing another is replaced whole
    redact.register("the-admin-key-123-and-more")
    assert redact.scrub("the-admin-key-123-and-more") == REDACTED
    assert redact.redact_args(["--k=the-admin-key-123", "-v"]) == [f"--k={REDACTED}", "-v"]


def test_redact_args_hides_secret_named_assignments_whatever_their_length() -> None:
    """Triton's restricted-API options carry the admin key after its header name."""
    args = [
        "--http-restricted-api=model-repository,logging:hps-admin-key=k3Y",
        "--grpc-restricted-protocol=trace:triton-grpc-protocol-hps-admin-key=k3Y",
        "--model-repository=/m",
        "--log-verbose=1",
    ]
    assert redact.redact_args(args) == [
        f"--http-restricted-api=model-repository,logging:hps-admin-key={REDACTED}",
        f"--grpc-restricted-protocol=trace:triton-grpc-protocol-hps-admin-key={REDACTED}",
        "--model-repository=/m",
        "--log-verbose=1",
    ]


def test_register_config_takes_a_pydantic_config(tmp_path) -> None:
    from tests.helpers import make_config

    config = make_config(
        tmp_path,
        volatile_db={"type": "hash_map", "password": "vdb-password-9"},
        update_source={
            "type": "kafka",
            "hps_kafka_config": {"sasl.password": "sasl-password-8", "acks": "all"},
        },
    )
    redact.register_config(config)
    assert {"vdb-password-9", "sasl-password-8"} <= redact.registered()
    assert "all" not in redact.registered()


def _logger(stream: io.StringIO) -> logging.Logger:
    logger = logging.getLogger(f"test_redact.{id(stream)}")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    redact.install_log_filter(logger)
    return logger


def test_log_filter_on_message_args_and_exception() -> None:
    redact.register("log-secret-abc")
    out = io.StringIO()
    logger = _logger(out)
    logger.warning("in the message: log-secret-abc")
    logger.warning("in an argument: %s, %d", "log-secret-abc", 7)
    logger.warning("in a mapping: %(v)s", {"v": "x log-secret-abc"})
    logger.warning("in an object: %s", ValueError("bad log-secret-abc"))
    try:
        raise RuntimeError("exception log-secret-abc")
    except RuntimeError:
        logger.exception("failed")
    text = out.getvalue()
    assert "log-secret-abc" not in text
    assert text.count(REDACTED) == 6  # the traceback shows the raising line too
    assert "in an argument: <redacted>, 7" in text
    assert "RuntimeError: exception <redacted>" in text and "Traceback" in text


def test_log_filter_keeps_argument_tuples() -> None:
    """uvicorn's access formatter unpacks record.args: scrubbing keeps the tuple."""
    redact.register("query-secret-1")
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "f", 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", "/x?t=query-secret-1", "1.1", 200), None,
    )  # fmt: skip
    redact.RedactingFilter().filter(record)
    assert record.args == ("127.0.0.1:1", "GET", f"/x?t={REDACTED}", "1.1", 200)


def test_installed_process_wide_covers_handlers_added_later() -> None:
    redact.register("late-handler-secret")
    redact.install_log_filter()
    redact.install_log_filter()  # idempotent
    out = io.StringIO()
    logger = logging.getLogger("test_redact.later")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(out))  # no filter of ours on it
    try:
        logger.error("late-handler-secret and %s", "late-handler-secret")
    finally:
        logger.handlers.clear()
    assert out.getvalue() == f"{REDACTED} and {REDACTED}\n"

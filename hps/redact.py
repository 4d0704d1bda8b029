"""Redaction of secrets: one helper for logs, error bodies, config dumps and manifests.

A setting is secret when its *name* matches one of :data:`SECRET_NAME_PATTERNS` (shell
patterns, case-insensitive, matched against the whole name), e.g. ``password``,
``ssl.keystore.password``, ``sasl.oauthbearer.config``, ``ssl.key.pem``,
``HPS_ADMIN_TOKEN``. Deciding by pattern, not by a list of names, keeps new client settings
(librdkafka has dozens) covered without code changes. A name that says where a secret is
kept rather than holding it (``hps_password_env``, ``HPS_ADMIN_KEY_FILE``: the
:data:`REFERENCE_SUFFIXES`) is not secret: it and what it maps to stay readable.

Known secret *values* (the admin key, the control plane's token, passwords read from the
config) are registered with :func:`register` (:func:`register_config` for a whole config);
:func:`scrub` replaces every registered value in a text, and :func:`install_log_filter`
applies it to every log record of the process, so a value that reaches a message by
accident (a command line, an exception text) is still never printed.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar, cast

from pydantic import BaseModel

from hps.errors import ConfigError

REDACTED = "<redacted>"

SECRET_NAME_PATTERNS: tuple[str, ...] = (
    "*password*",
    "*passwd*",
    "*secret*",
    "*token*",
    "*.key.pem",
    "key.pem",
    "*_key_pem",
    "sasl.*config",
    "sasl.*.config",
    "*admin_key*",
    "*admin-key*",
    "*api_key*",
    "*api-key*",
    "*credentials*",
    "*passphrase*",
    "*private.key*",
    "*private_key*",
)
# Names of where a secret is kept (an environment variable, a mounted file), not secrets.
REFERENCE_SUFFIXES: tuple[str, ...] = ("_env", "_file", "_files", ".location")
# Shorter values are not scrubbed from free text: a 3-character password would redact
# every occurrence of those letters in a log line. Such a value still never appears as the
# value of a secret-named setting (redact_mapping does not look at length).
MIN_SCRUB_LENGTH = 6
MIN_KEY_LENGTH = 16
"""The shortest admin key or token HPS takes: hard to guess, and long enough to scrub."""
# `name=value` inside a command-line argument (`--http-restricted-api=...:hps-admin-key=V`)
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^\s,:=]+)")

_lock = threading.Lock()
_values: set[str] = set()

T = TypeVar("T")


@functools.lru_cache(maxsize=4096)  # a report redacts the same few dozen names per table
def is_secret_name(name: str) -> bool:
    """True when a setting called ``name`` holds a secret."""
    lowered = name.lower()
    if is_reference_name(lowered):
        return False
    return any(fnmatch.fnmatchcase(lowered, p) for p in SECRET_NAME_PATTERNS)


def secret_name_regex() -> str:
    """:func:`is_secret_name` before its reference exception, as one regular expression in
    the dialect JSON Schema takes (no flags: letters match in either case). The Helm
    chart's values.schema.json refuses what it matches in ``kafka.config``, and as an inline
    ``value`` in ``triton.extraEnv`` (unless :func:`reference_name_regex` matches too)."""
    return "|".join(f"^{_pattern(p)}$" for p in SECRET_NAME_PATTERNS)


def reference_name_regex() -> str:
    """:func:`is_reference_name` as a regular expression (see :func:`secret_name_regex`)."""
    return "(" + "|".join(_pattern(s) for s in REFERENCE_SUFFIXES) + ")$"


def _pattern(shell: str) -> str:
    """A shell pattern of lowercase letters, digits, ``._-`` and ``*`` as a regular
    expression that matches its letters in either case."""
    assert set(shell) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-*"), shell
    return "".join(
        ".*" if c == "*" else "\\." if c == "." else f"[{c}{c.upper()}]" if c.isalpha() else c
        for c in shell
    )


def is_reference_name(name: str) -> bool:
    """True when ``name`` says where secrets are kept (``hps_kafka_config_env``): what it
    maps to are names of variables or files, shown as they are."""
    return name.lower().endswith(REFERENCE_SUFFIXES)


def register(*values: str | None) -> None:
    """Remember secret values so that :func:`scrub` removes them from any text."""
    with _lock:
        _values.update(v for v in values if v and len(v) >= MIN_SCRUB_LENGTH)


def registered() -> frozenset[str]:
    with _lock:
        return frozenset(_values)


def register_config(config: object) -> None:
    """Register every secret-named value of a config (a pydantic model or a mapping):
    the volatile_db password, the Kafka client's SASL/SSL secrets, ..."""
    doc = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    _redact(doc)


def protect(config: object = None, *values: str | None) -> None:
    """What every HPS process does at start: scrub all its log records
    (:func:`install_log_filter`) and register the secrets it knows (``values``: the admin
    key, the control plane's token; ``config``'s secret-named settings)."""
    install_log_filter()
    register(*values)
    if config is not None:
        register_config(config)


def scrub(text: str, extra: Iterable[str] = (), keep: Iterable[str] = ()) -> str:
    """``text`` with every registered secret value (and ``extra``) replaced by REDACTED,
    but those of ``keep`` (values the reader of ``text`` sent itself: see
    :func:`redact_mapping`)."""
    values = registered() | {v for v in extra if v and len(v) >= MIN_SCRUB_LENGTH}
    values -= set(keep)
    # Longest first: a secret containing another is replaced whole.
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_mapping(doc: T, keep: Iterable[str] = ()) -> T:
    """A copy of a JSON-like document with the value of every secret-named key redacted,
    at any depth (mappings in lists included), and registered values scrubbed from the
    other strings (a password inside a URL).

    ``keep``: registered values not scrubbed from those strings, because the document
    answers a request that carried them (an error echoing a name the client sent): were
    they replaced, where ``<redacted>`` appears would tell a client which of its guesses is
    a secret. Values of secret-named keys are redacted whatever ``keep`` holds.

    Secret values found in a document are registered, so later log lines scrub them too.
    Empty values stay empty (an unset password is not a secret worth hiding).
    """
    return cast(T, _redact(doc, frozenset(keep)))  # the same shape, values redacted


def _redact(doc: object, keep: frozenset[str] = frozenset()) -> object:
    if isinstance(doc, Mapping):
        out: dict[object, object] = {}
        for key, value in doc.items():
            if isinstance(key, str) and is_secret_name(key) and value not in (None, "", {}, []):
                _register_all(value)
                out[key] = REDACTED
            elif isinstance(key, str) and is_reference_name(key):
                out[key] = _copy(value)
            else:
                out[key] = _redact(value, keep)
        return out
    if isinstance(doc, list | tuple):
        return [_redact(v, keep) for v in doc]
    if isinstance(doc, str):
        return scrub(doc, keep=keep)
    return doc


def _copy(doc: object) -> object:
    if isinstance(doc, Mapping):
        return {k: _copy(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_copy(v) for v in doc]
    return doc


def _register_all(value: object) -> None:
    """Register the strings of a secret value (a string, or a mapping or list of them)."""
    if isinstance(value, str):
        register(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            _register_all(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _register_all(v)


def redact_args(args: Iterable[str]) -> list[str]:
    """A command line with secret values scrubbed (for the one place that logs it): the
    registered ones, and the value of every ``name=value`` whose name is secret."""
    return [_ASSIGNMENT.sub(_hide_assigned, scrub(a)) for a in args]


def _hide_assigned(m: re.Match[str]) -> str:
    return f"{m['name']}={REDACTED}" if is_secret_name(m["name"]) else m[0]


def check_key(value: str, where: str) -> None:
    """ConfigError unless ``value`` is a usable admin key or token (:data:`MIN_KEY_LENGTH`)."""
    if len(value) < MIN_KEY_LENGTH:
        raise ConfigError(
            f"{where}: {len(value)} characters; a key or token needs at least "
            f"{MIN_KEY_LENGTH} (e.g. `openssl rand -hex 24`)"
        )


def scrub_record(record: logging.LogRecord) -> None:
    """Scrub registered secrets from a record's message, its arguments and its exception.

    Arguments keep their places (some formatters, e.g. uvicorn's access log, unpack them);
    only when the rendered message still holds a secret is it rendered here, scrubbed.
    """
    if not registered():
        return
    if isinstance(record.msg, str):
        record.msg = scrub(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(scrub(a) if isinstance(a, str) else a for a in record.args)
    elif isinstance(record.args, Mapping):
        record.args = {k: scrub(v) if isinstance(v, str) else v for k, v in record.args.items()}
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: logging reports it itself
        message = None
    if message is not None and scrub(message) != message:
        record.msg, record.args = scrub(message), None
    if record.exc_info and record.exc_info[1] is not None:
        text = logging.Formatter().formatException(record.exc_info)
        if scrub(text) != text:  # formatters print exc_text when there is no exc_info
            record.exc_info, record.exc_text = None, scrub(text)
    elif record.exc_text:
        record.exc_text = scrub(record.exc_text)
    if record.stack_info:
        record.stack_info = scrub(record.stack_info)


class RedactingFilter(logging.Filter):
    """Scrubs registered secrets from a record's message, arguments and exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        scrub_record(record)
        return True


_factory_lock = threading.Lock()
_installed = False


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Scrub every log record of this process (or only what ``logger``'s handlers emit).

    Without ``logger``: every record is scrubbed where it is made (a record factory), so
    handlers configured later (uvicorn's, a library's) are covered too, and a
    :class:`RedactingFilter` goes on each handler of the root logger as well.
    """
    global _installed
    if logger is None:
        with _factory_lock:
            if not _installed:
                logging.setLogRecordFactory(_scrubbing_factory(logging.getLogRecordFactory()))
                _installed = True
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def _scrubbing_factory(
    inner: Callable[..., logging.LogRecord],
) -> Callable[..., logging.LogRecord]:
    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = inner(*args, **kwargs)
        scrub_record(record)
        return record

    return factory

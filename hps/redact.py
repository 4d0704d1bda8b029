"""Redaction of secrets: one helper for logs, error bodies, config dumps and manifests.

A setting is secret when its *name* matches one of :data:`SECRET_NAME_PATTERNS` (shell
patterns, case-insensitive, matched against the last dotted or underscored part as well as
the whole name), e.g. ``password``, ``ssl.keystore.password``, ``sasl.oauthbearer.config``,
``ssl.key.pem``, ``HPS_ADMIN_TOKEN``. Deciding by pattern, not by a list of names, keeps new
client settings (librdkafka has dozens) covered without code changes.

Known secret *values* (the admin key, the control plane's token, passwords read from the
config) are registered with :func:`register`; :func:`scrub` replaces every registered value
in a text, and :class:`RedactingFilter` applies it to every log record, so a value that
reaches a message by accident (a command line, an exception text) is still never printed.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TypeVar

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
)
# Shorter values are not scrubbed from free text: a 3-character password would redact
# every occurrence of those letters in a log line. Such a value still never appears as the
# value of a secret-named setting (redact_mapping does not look at length).
MIN_SCRUB_LENGTH = 6

_lock = threading.Lock()
_values: set[str] = set()

T = TypeVar("T")


def is_secret_name(name: str) -> bool:
    """True when a setting called ``name`` holds a secret."""
    lowered = name.lower()
    return any(fnmatch.fnmatchcase(lowered, p) for p in SECRET_NAME_PATTERNS)


def register(*values: str | None) -> None:
    """Remember secret values so that :func:`scrub` removes them from any text."""
    with _lock:
        _values.update(v for v in values if v and len(v) >= MIN_SCRUB_LENGTH)


def registered() -> frozenset[str]:
    with _lock:
        return frozenset(_values)


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every registered secret value (and ``extra``) replaced by REDACTED."""
    values = registered() | {v for v in extra if v and len(v) >= MIN_SCRUB_LENGTH}
    # Longest first: a secret containing another is replaced whole.
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_mapping(doc: T) -> T:
    """A copy of a JSON-like document with the value of every secret-named key redacted.

    Secret values found in a document are registered, so later log lines scrub them too.
    Empty values stay empty (an unset password is not a secret worth hiding).
    """
    return _redact(doc)  # type: ignore[return-value]


def _redact(doc: object) -> object:
    if isinstance(doc, Mapping):
        out: dict[object, object] = {}
        for key, value in doc.items():
            if isinstance(key, str) and is_secret_name(key) and value not in (None, "", {}, []):
                if isinstance(value, str):
                    register(value)
                out[key] = REDACTED
            else:
                out[key] = _redact(value)
        return out
    if isinstance(doc, list | tuple):
        return [_redact(v) for v in doc]
    return doc


def redact_args(args: Iterable[str]) -> list[str]:
    """A command line with secret values scrubbed (for the one place that logs it)."""
    return [scrub(a) for a in args]


class RedactingFilter(logging.Filter):
    """Scrubs registered secrets from a record's rendered message (and its exception)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            scrubbed = scrub(text)
            if scrubbed != text:
                record.exc_info, record.exc_text = None, scrubbed
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Attach one :class:`RedactingFilter` to every handler of ``logger`` (the root)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())

"""What the sections of the ps.json share: the frozen base model, names, secrets from the
environment, regular expressions, the keys of older HugeCTR releases, and the keys HugeCTR
documents but never read."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from hps.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,128}$(?!\n)")
r"""A model, table or variable name, whole (with ``.match``), at most 128 characters (it
names folders and files: a longer one failed on the file system's 255). ``$`` alone also
matches before a final newline (``"evil\n"`` would pass): ``(?!\n)`` keeps it to the end. The same
pattern reads alike as JSON Schema (ECMA 262: its ``$`` is the end), where the
control plane's OpenAPI publishes it; ``\A``/``\Z`` would not."""
SIDE_TABLE_MARK = "__hps_"
"""What HPS's own side tables append to a table's name (``<table>__hps_version``, ...):
no configured table name may contain it."""
NO_LIMIT = 2**64 - 1
"""``overflow_margin`` when none is set: the one "no capacity limit" value of every L2."""


class Frozen(BaseModel):
    """A ps.json section: immutable, and an unknown key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def read_text(path: Path, what: str) -> str:
    """The text of a configuration file (UTF-8); ConfigError naming ``what`` and ``path``
    when it cannot be read or is not text. The contents never reach the message."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}{path}: not UTF-8 text (byte {exc.start})") from None


def rename_deprecated(data: object, renames: dict[str, str], where: str) -> object:
    """Map keys of older HugeCTR releases onto their replacement, with a warning."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in renames.items():
        if old in data:
            value = data.pop(old)
            warnings.warn(
                f"{where}.{old} is deprecated (HugeCTR < 3.4); use {where}.{new}",
                FutureWarning,
                stacklevel=2,
            )
            data.setdefault(new, value)
    return data


def drop_ignored(data: object, keys: tuple[str, ...]) -> object:
    """Remove keys HugeCTR documents but its ps.json parser never read (nor does HPS), once
    checked to be booleans, so that the files of its documentation load."""
    if not isinstance(data, dict) or not any(key in data for key in keys):
        return data
    data = dict(data)
    for key in keys:
        if key in data and not isinstance(value := data.pop(key), bool):
            raise ValueError(f"{key} must be true or false, not {value!r}")
    return data


def from_env(variable: str, what: str) -> str:
    """A secret named by environment variable: ``$NAME``, or the file ``$NAME_FILE`` names.

    ``NAME_FILE`` is how a mounted Kubernetes or Compose secret arrives: the file's content,
    less a trailing newline, is the secret. Setting both is an error. Messages name the
    variable and the file, never the content.
    """
    if not NAME_RE.match(variable):
        raise ValueError(f"{what}: {variable!r} is not an environment variable name")
    value = os.environ.get(variable)
    path = os.environ.get(f"{variable}_FILE")
    if value is not None and path is not None:
        raise ValueError(f"{what}: set {variable} or {variable}_FILE, not both")
    if path is not None:
        try:
            return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ValueError(f"{what}: {variable}_FILE names {path}: {reason}") from None
    if value is None:
        raise ValueError(
            f"{what}: environment variable {variable} is not set (nor {variable}_FILE)"
        )
    return value


def check_regexes(patterns: list[str]) -> list[str]:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {p!r}: {exc}") from None
    return patterns

"""Server-side paths a client names: confined to configured roots, resolved before the check.

These inputs of the control plane name files on the server: the import route's ``path``
(a folder holding ``key`` + ``emb_vector`` or ``keys.npy`` + ``vectors.npy``), the
warm-up's ``keyset_path`` and ``frequency_path``, and a version import's ``sparse_files``
(folders holding ``key`` + ``emb_vector``) and ``dense_file``. Each is accepted only when

- it is an absolute path (no NUL, at most :data:`MAX_PATH_CHARS` characters);
- resolved (every symlink followed, ``..`` applied: :meth:`pathlib.Path.resolve`), it lies
  under one of the roots (``hps_admin.path_roots`` of the ps.json; by default the ps.json's
  folder and the control plane's state folder), the roots resolved the same way;
- it is of the kind asked for (a regular file; a folder whose named files are regular files,
  each resolving under a root too), readable by the control plane;
- it is not a secret the deployment keeps there (Triton's admin key file
  ``hps-admin-key``, the files ``$HPS_ADMIN_KEY_FILE`` and ``$HPS_ADMIN_TOKEN_FILE`` name).

Anything else gets one :class:`hps.errors.RequestError` (HTTP 400) whose message is the same
whether the path lies outside the roots, does not exist, cannot be read or is of the wrong
kind (:data:`NOT_ALLOWED`): it names the path as given and nothing the server found there.
What is read afterwards is a file under the roots, so the readers' own messages (a keyset's
size, a frequency file's arrays) speak of those files only.

The check and the later open are two steps: whoever may write under a root can swap a
checked file for a link in between. Roots are folders only the deployment writes to.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hps.errors import RequestError

if TYPE_CHECKING:
    from hps.config import PSConfig
    from hps.service.state import AdminState

MAX_PATH_CHARS = 4096  # Linux's PATH_MAX
NOT_ALLOWED = "path not allowed or not found: {given}"
_SHOWN_CHARS = 256


def _denied(given: object, what: str) -> RequestError:
    text = given if isinstance(given, str) else repr(given)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    return RequestError(f"{NOT_ALLOWED.format(given=repr(text))} ({what})")


def default_roots(config: PSConfig, state_dir: Path) -> list[Path]:
    """``hps_admin.path_roots``, else the ps.json's folder and ``state_dir``."""
    if config.hps_admin.path_roots is not None:
        return [Path(r) for r in config.hps_admin.path_roots]
    roots = [state_dir]
    if config.source != "<memory>":
        roots.insert(0, Path(config.source).resolve().parent)
    return roots


_REGISTERED: set[Path] = set()


def register_secret_file(path: str | Path) -> None:
    """A file a secret is read from that no environment variable names (``hps admin
    --token-file``): never a path a client may name."""
    _REGISTERED.add(Path(path).resolve())


def _secret_files() -> set[Path]:
    """The files secrets are read from, resolved: those registered, and every file an
    environment variable ``*_FILE`` names (the control plane's token, Triton's admin key,
    the Redis and Kafka secrets as mounted Kubernetes or Compose secrets arrive)."""
    out = set(_REGISTERED)
    for env, named in os.environ.items():
        if env.endswith("_FILE") and named.strip():
            try:
                out.add(Path(named.strip()).resolve())
            except (OSError, ValueError, RuntimeError):
                continue
    return out


class ServerPaths:
    """Decides which server-side paths a client may name (see the module docstring)."""

    def __init__(self, roots: Iterable[str | Path]) -> None:
        self.roots = tuple(Path(os.path.realpath(r)) for r in roots)

    @classmethod
    def of(cls, state: AdminState) -> ServerPaths:
        return cls(default_roots(state.config, state.state_dir))

    def file(self, given: str, what: str = "a readable file under the path roots") -> Path:
        """``given`` resolved: a readable regular file under a root, else :data:`NOT_ALLOWED`."""
        resolved = self._resolve(given)
        if resolved is None or not self._is(resolved, stat.S_ISREG, os.R_OK):
            raise _denied(given, what)
        return resolved

    def folder(self, given: str, names: Sequence[str]) -> Path:
        """``given`` resolved: a folder under a root whose files ``names`` are readable
        regular files under a root (each resolved too), else :data:`NOT_ALLOWED`."""
        what = f"a folder under the path roots holding {' and '.join(names)}"
        resolved = self._resolve(given)
        if resolved is None or not self._is(resolved, stat.S_ISDIR, os.R_OK | os.X_OK):
            raise _denied(given, what)
        for name in names:
            inner = self._resolve(str(resolved / name))
            if inner is None or not self._is(inner, stat.S_ISREG, os.R_OK):
                raise _denied(given, what)
        return resolved

    def _resolve(self, given: object) -> Path | None:
        """The real path of ``given`` when it exists under a root and is no secret."""
        if not isinstance(given, str) or not given or len(given) > MAX_PATH_CHARS:
            return None
        if "\x00" in given or not os.path.isabs(given):
            return None
        try:
            resolved = Path(given).resolve(strict=True)
        except (OSError, ValueError, RuntimeError):  # missing, unreadable, a loop, too long
            return None
        if not any(resolved == r or resolved.is_relative_to(r) for r in self.roots):
            return None
        from hps.triton.admin_key import KEY_FILE_NAME

        if resolved.name == KEY_FILE_NAME or resolved in _secret_files():
            return None
        return resolved

    @staticmethod
    def _is(path: Path, kind: Callable[[int], bool], access: int) -> bool:
        try:
            mode = path.stat().st_mode
        except OSError:
            return False
        return kind(mode) and os.access(path, access)

"""The control plane's config follows the set of models the node serves.

Models are added and removed at runtime by ``POST`` and ``DELETE /v1/models`` of this
control plane, of another one on the node, or from Python (:mod:`hps.triton.models`); each
change is written to the node's version record (:mod:`hps.versions.models`), which every
process reads with the ps.json. :class:`ServedConfig` is the control plane's config: the
ps.json as served when it started (:func:`hps.triton.serving.serving_config`) with the
record's models added and removed (:func:`hps.versions.models.served_config`), computed
again whenever the record's file changes. Each read costs one ``stat`` of the file: the
record is replaced by an atomic rename at every write, so any change shows as a new inode
(and size, and modification time). No restart is needed, and no route reads a stale set:
the models listed, their tables, the table routes and ``/readyz`` see a change at their
next request.

A record that cannot be read leaves the last set read in place (logged once per change of
the file); the routes that read the record themselves report the problem.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from hps.config import PSConfig
from hps.errors import HPSError
from hps.versions import VersionRegistry
from hps.versions.models import served_config

log = logging.getLogger(__name__)

Signature = tuple[int, int, int] | None


def _signature(path: Path) -> Signature:
    """(inode, size, mtime in ns) of the record; None while there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class ServedConfig:
    """``base`` (the ps.json as served at start) following the models served now."""

    def __init__(self, base: PSConfig) -> None:
        self.base = base
        self.path = VersionRegistry(base).path  # None: no state folder, nothing to follow
        self._lock = threading.Lock()
        self._signature: Signature = (-1, -1, -1)  # never a file's: the first read computes
        self._config = base

    def current(self) -> PSConfig:
        """The config with the models the node serves now (see the module docstring)."""
        if self.path is None:
            return self._config
        signature = _signature(self.path)  # taken before the read: a later change reads again
        if signature == self._signature:
            return self._config
        with self._lock:
            if signature != self._signature:
                try:
                    self._config = served_config(self.base)
                except HPSError as exc:
                    log.warning("%s: keeping the models served before: %s", self.path, exc)
                self._signature = signature
            return self._config

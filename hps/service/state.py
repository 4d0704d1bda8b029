"""What the control plane holds: the config, its views of L2/L3, Triton, the jobs.

Tiers as the control plane reaches them:

- L3 (RocksDB) is read through a *secondary* instance that catches up before every read;
  writes (import, delete without Kafka) open it read-write for their duration only, under
  the same lock ``hps serve`` takes to import (:func:`hps.triton.deploy.writer_lock`).
- L2 is reached when it is shared (``multi_process_hash_map`` of this node, Redis); an
  in-process ``hash_map`` belongs to each serving process and is reported as such.
- With Kafka configured, writes are published (:class:`hps.updates.Publisher`) and applied
  by ``hps consume`` and the serving processes; otherwise the control plane writes L2/L3
  and reloads the model through Triton so that every instance reopens L3 and rebuilds L1.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hps.config import PSConfig
from hps.errors import BackendError, UnknownTableError
from hps.lookup import LookupSession
from hps.service.jobs import JobRegistry
from hps.service.triton_admin import TritonAdmin
from hps.triton.repository import served_models
from hps.types import TableSpec

log = logging.getLogger(__name__)

LOCAL_L2 = ("hash_map", "parallel_hash_map")


def l2_scope(config: PSConfig) -> str:
    vtype = config.volatile_db.type
    if vtype == "disabled":
        return "none"
    if vtype in LOCAL_L2:
        return "process"
    return "node" if vtype == "multi_process_hash_map" else "cluster"


def topology(config: PSConfig) -> dict[str, Any]:
    """What runs where, from the config alone."""
    kafka = config.update_source.enabled
    return {
        "served_models": [
            {"triton_name": s.triton_name, "hps_model": s.hps_model, "instances": s.instances}
            for s in served_models(config)
        ],
        "l2": {"type": config.volatile_db.type, "scope": l2_scope(config)},
        "l3": {
            "type": config.persistent_db.type,
            "path": config.persistent_db.path if config.persistent_db.type != "disabled" else None,
        },
        "updates": (
            "none" if not kafka else ("embedded" if l2_scope(config) == "process" else "shared")
        ),
        "write_channel": "kafka" if kafka else "direct+reload",
    }


@dataclass
class AdminState:
    config: PSConfig
    token: str | None
    triton: TritonAdmin
    state_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hps-admin-")))
    jobs: JobRegistry = field(default_factory=JobRegistry)
    _reader: LookupSession | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _publisher: Any = field(default=None, init=False)

    # -- tables ----------------------------------------------------------------------------

    def spec(self, model: str, table: str) -> TableSpec:
        m = self.config.model(model)
        for spec in m.tables:
            if spec.table == table:
                return spec
        raise UnknownTableError(f"model {model!r} has no table {table!r}; has {m.table_names}")

    @property
    def kafka(self) -> bool:
        return self.config.update_source.enabled

    def _shared_config(self) -> PSConfig:
        """The config with a process-local L2 switched off (not ours to read or write)."""
        if self.config.volatile_db.type not in LOCAL_L2:
            return self.config
        vdb = self.config.volatile_db.model_copy(update={"type": "disabled"})
        return self.config.model_copy(update={"volatile_db": vdb})

    def reader(self) -> LookupSession:
        """A session over the shared L2 and a secondary L3, caught up; opened on first use."""
        from hps.build import build_session

        with self._lock:
            if self._reader is None:
                mode = "secondary" if self.config.persistent_db.type != "disabled" else None
                self._reader = build_session(
                    self._shared_config(), with_cache=False, persistent_mode=mode
                )
            reader = self._reader
        reader.catch_up()
        return reader

    def reset_reader(self) -> None:
        with self._lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.close()

    @contextlib.contextmanager
    def writer(self) -> Iterator[LookupSession]:
        """A read-write session over L3 and the shared L2, under the import lock."""
        from hps.build import build_session
        from hps.triton.deploy import writer_lock

        config = self._shared_config()
        with writer_lock(config):
            try:
                session = build_session(config, with_cache=False, persistent_mode="read_write")
            except BackendError as exc:
                raise BackendError(f"cannot open L3 for writing (another writer?): {exc}") from exc
            try:
                yield session
            finally:
                session.close()

    def publisher(self) -> Any:
        from hps.updates import Publisher

        with self._lock:
            if self._publisher is None:
                src = self.config.update_source
                self._publisher = Publisher(src.brokers, config=dict(src.hps_kafka_config))
            return self._publisher

    def reload(self, model: str, config: dict[str, Any] | None = None) -> list[str]:
        """Reload every Triton model serving HPS model ``model``; the Triton names."""
        self.config.model(model)
        names = [s.triton_name for s in served_models(self.config) if s.hps_model == model]
        for name in names:
            self.triton.load(name, config if name == model else None)
        return names

    def close(self) -> None:
        self.jobs.close()
        self.reset_reader()
        if self._publisher is not None:
            self._publisher.close()

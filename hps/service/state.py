"""What the control plane holds: the config, its views of L2/L3, Triton, the jobs.

Tiers as the control plane reaches them:

- L3 (RocksDB) is read through a *secondary* instance that catches up before every read;
  writes (import, delete without Kafka) open it read-write for their duration only, under
  the same lock ``hps serve`` takes to import (:func:`hps.loading.imports.import_lock`).
- L2 is reached when it is shared (``multi_process_hash_map`` of this node, Redis); an
  in-process ``hash_map`` belongs to each serving process and is reported as such.
- With Kafka configured, writes are published (:class:`hps.updates.Publisher`) and applied
  by ``hps consume`` and the serving processes; otherwise the control plane writes L2/L3
  and reloads the model through Triton so that every instance reopens L3 and rebuilds L1.

The models are those the node serves now (:mod:`hps.service.served`): ``config`` follows
the models added and removed at runtime, here or by any other process of the node.

Model versions (:mod:`hps.versions`): the table routes act on each model's live version (the
node's version record, read at each request: an activation, here or by ``hps versions``,
is followed at once); the reader declares every ready or live version's tables
(:mod:`hps.service.version_report`) and is reopened when that set changes.

The state dir (``hps admin --state-dir``) keeps what must outlive the process: job records
(``jobs/``) and staged uploads (``uploads/``), read again at start (:mod:`hps.service.job_records`:
queued imports resume, interrupted ones are marked so, stale uploads are removed), and
warm-up keysets (``warmup/``).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from hps.config import ModelConfig, PSConfig
from hps.errors import BackendError, UnknownTableError
from hps.loading.imports import import_lock, repository_dir
from hps.service.job_records import Job, Work
from hps.service.jobs import JobRegistry
from hps.service.recent import Recent
from hps.service.served import ServedConfig
from hps.service.triton_admin import TritonAdmin
from hps.tiers import Tiers
from hps.topology import Topology, topology
from hps.triton.repository import served_models
from hps.types import JSON, TableSpec
from hps.versions import VersionRegistry

if TYPE_CHECKING:
    from hps.loading.loader import TableSource
    from hps.service.info import Lags, MetricsRead
    from hps.service.uploads import Format
    from hps.updates import Publisher
    from hps.updates.broker_admin import BrokerAdmin

log = logging.getLogger(__name__)

REPORT_MAX_AGE_S = 1.0
"""How old the Triton metrics (hit counts, update freshness) and the consumer lags in a table
report may be: each is read at most this often, however many reports are asked for (a read
of Triton's /metrics costs Triton and this process milliseconds, a lag read a round of
requests to the broker)."""


def topology_view(config: PSConfig, topo: Topology) -> JSON:
    """The Topology, plus the Triton models and the channel writes take from here."""
    return {
        **topo.as_dict(),
        "served_models": [
            {"triton_name": s.triton_name, "hps_model": s.hps_model, "instances": s.instances}
            for s in served_models(config)
        ],
        "write_channel": (
            "kafka"
            if config.update_source.enabled
            else "direct+journal"
            if topo.state_dir is not None
            else "direct+reload"
        ),
    }


@dataclass
class _Lease:
    """A reader and how many requests are reading through it."""

    tiers: Tiers
    users: int = 0
    retired: bool = False  # replaced: closed by its last user


def _close(tiers: Tiers | None) -> None:
    if tiers is not None:
        with contextlib.suppress(Exception):
            tiers.close()


@dataclass
class AdminState:
    # the ps.json as served when the control plane started (hps.triton.serving.serving_config)
    base: PSConfig
    token: str | None
    triton: TritonAdmin
    state_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hps-admin-")))
    jobs: JobRegistry = field(default_factory=JobRegistry)
    # the Triton model repository `hps serve` serves (activations write version folders)
    repository: Path | None = None
    # held by every write of L2/L3 from this process (writer(), version imports, retires)
    writes: threading.RLock = field(default_factory=threading.RLock, init=False)
    # one activation or retire at a time
    versions_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _reader: _Lease | None = field(default=None, init=False)
    _reader_tables: frozenset[tuple[str, str]] = field(default=frozenset(), init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _publisher: Publisher | None = field(default=None, init=False)
    _broker: BrokerAdmin | None = field(default=None, init=False)
    _served: ServedConfig = field(init=False, repr=False)
    # the reads table reports share (hps.service.info)
    metrics_reads: Recent[None, MetricsRead] = field(
        default_factory=lambda: Recent(REPORT_MAX_AGE_S), init=False
    )
    lag_reads: Recent[frozenset[str], Lags] = field(
        default_factory=lambda: Recent(REPORT_MAX_AGE_S), init=False
    )

    def __post_init__(self) -> None:
        from hps.service import models, versions

        self._served = ServedConfig(self.base)
        self.topology = topology(self.base)
        if self.repository is None:
            self.repository = repository_dir(self.config)
        if self.jobs.folder is None:
            self.jobs.attach(self.state_dir / "jobs", self.uploads_dir)
            self.jobs.resumable("import", self._resume_import)
            self.jobs.resumable(versions.IMPORT_JOB, partial(versions.resume_import, self))
            self.jobs.resumable(models.ADD_JOB, partial(models.resume_add, self))
            self.jobs.recover()

    @property
    def config(self) -> PSConfig:
        """The ps.json as served, with the models the node serves now
        (:mod:`hps.service.served`)."""
        return self._served.current()

    @property
    def uploads_dir(self) -> Path:
        """Where uploads are staged until their import job ends."""
        return self.state_dir / "uploads"

    # -- jobs ------------------------------------------------------------------------------

    def submit_import(
        self, source: TableSource, fmt: Format, folder: Path, staged: Path | None, rows: int
    ) -> Job:
        """Queue the import of a validated ``source`` (files in ``folder``; ``staged``: the
        upload folder to remove when the job ends), recorded so that a restart resumes it."""
        spec = source.spec
        params = {"model": spec.model, "table": spec.table, "version": str(spec.version),
                  "format": fmt, "folder": str(folder)}  # fmt: skip
        job = Job("import", spec.name, rows, params=params,
                  staged=str(staged) if staged is not None else None)  # fmt: skip
        # A server path may change while the job waits its turn: it is read again then. A
        # staged upload is our own copy, validated already.
        return self.jobs.submit(job, self._import_work(source, validate=staged is None))

    def _import_work(self, source: TableSource, validate: bool) -> Work:
        from hps.service import direct, uploads

        def work(job: Job) -> JSON:
            # One open for both passes: what is loaded is what was validated, whatever
            # replaces the paths meanwhile.
            with source.opened() as files:
                if validate:  # the files are read again before anything is written
                    uploads.validate(files)
                return direct.import_table(self, job, files)

        return work

    def _resume_import(self, job: Job) -> Work:
        from hps.service import uploads

        p = job.params
        if p.get("format") not in ("sparse", "npy"):
            raise ValueError(f"its record names no known format: {p.get('format')!r}")
        fmt: Format = "npy" if p["format"] == "npy" else "sparse"
        spec = self.spec(p["model"], p["table"])
        if spec.version != int(p.get("version", "1")):  # never into another version's rows
            raise ValueError(
                f"it was for version {p.get('version', '1')} of model {p['model']!r}; "
                f"version {spec.version} is live now"
            )
        source = uploads.source(Path(p["folder"]), fmt, spec)
        return self._import_work(source, validate=True)

    def wait_loaded(self, model: str, timeout: float | None = None) -> None:
        """Wait until no Triton model serving HPS model ``model`` is being reloaded (a
        warm-up or an inference then finds it loaded); BackendUnavailable past ``timeout``."""
        from hps.service.triton_admin import LOAD_TIMEOUT_S

        for served in served_models(self.config):
            if served.hps_model == model:
                self.triton.wait_loaded(served.triton_name, timeout or LOAD_TIMEOUT_S)

    # -- tables ----------------------------------------------------------------------------

    def live_model(self, model: str) -> ModelConfig:
        """``model``'s entry at its live version (as recorded now; unknown: 404)."""
        registry = VersionRegistry(self.config)
        if registry.path is None:
            return self.config.model(model)  # no record: version 1, the ps.json's entry
        return registry.model_at(model, registry.live(model))

    def live_config(self) -> PSConfig:
        """``config`` with each model's entry at its live version (as recorded now); a
        model that has none (removed at runtime) is left out."""
        return VersionRegistry(self.config).live_config()

    def spec(self, model: str, table: str) -> TableSpec:
        """The table of ``model``'s live version."""
        m = self.live_model(model)
        for spec in m.tables:
            if spec.table == table:
                return spec
        raise UnknownTableError(f"model {model!r} has no table {table!r}; has {m.table_names}")

    @property
    def kafka(self) -> bool:
        return self.config.update_source.enabled

    @property
    def l2_reachable(self) -> bool:
        """An in-process L2 belongs to each serving process: not ours to read or write."""
        return self.topology.l2 not in (None, "process")

    @contextlib.contextmanager
    def reading(self, *, catch_up: bool = False) -> Iterator[Tiers]:
        """The shared L2 and a secondary L3, caught up within
        :data:`hps.tiers.tiers.SECONDARY_LAG_S` (now, if ``catch_up``; writes of ours reopen
        it: :meth:`reset_reader`); opened on first use,
        and again when the versions to declare changed (an import, activation or retire).
        A reader replaced meanwhile is closed when its last user leaves the block, never
        under one."""
        from hps.service.version_report import declare, declared

        l3, l2 = declared(self.config)
        names = frozenset([*(("l3", s.name) for s in l3), *(("l2", s.name) for s in l2)])
        stale = None
        with self._lock:
            if self._reader is not None and names != self._reader_tables:
                stale = self._retire_locked()
            if self._reader is None:
                tiers = Tiers.open(self.config, l3_mode="secondary", l2=self.l2_reachable)
                try:
                    declare(tiers, l3, l2)
                except BaseException:
                    tiers.close()
                    raise
                self._reader, self._reader_tables = _Lease(tiers), names
            lease = self._reader
            lease.users += 1
        _close(stale)
        try:
            if catch_up:
                lease.tiers.catch_up()
            else:
                lease.tiers.catch_up_if_stale()
            yield lease.tiers
        finally:
            with self._lock:
                lease.users -= 1
                done = lease.retired and lease.users == 0
            _close(lease.tiers if done else None)

    def reset_reader(self) -> None:
        """Our own write: the next reader opens anew (the current one closes once unused)."""
        with self._lock:
            stale = self._retire_locked()
        _close(stale)

    def _retire_locked(self) -> Tiers | None:
        """Take the reader out of service; it, when no one holds it (else its last user
        closes it). Call under ``_lock``."""
        lease, self._reader = self._reader, None
        if lease is None:
            return None
        lease.retired = True
        return lease.tiers if lease.users == 0 else None

    @contextlib.contextmanager
    def writer(self) -> Iterator[Tiers]:
        """L3 read-write and the shared L2, under the node's import lock."""
        lock = (
            import_lock(self.topology.state_dir)
            if self.topology.state_dir is not None
            else contextlib.nullcontext()
        )
        with self.writes, lock:
            try:
                tiers = Tiers.open(self.config, l3_mode="read_write", l2=self.l2_reachable)
            except BackendError as exc:
                raise BackendError(f"cannot open L3 for writing (another writer?): {exc}") from exc
            try:
                tiers.open_tables(self.live_config().tables)
                yield tiers
            finally:
                tiers.close()

    def publisher(self) -> Publisher:
        from hps.updates import Publisher

        with self._lock:
            if self._publisher is None:
                src = self.config.update_source
                self._publisher = Publisher(src.brokers, config=src.kafka_settings)
            return self._publisher

    def broker(self) -> BrokerAdmin:
        """This process's one admin client of the broker (lag reports, readiness)."""
        from hps.updates.broker_admin import BrokerAdmin

        with self._lock:
            if self._broker is None:
                src = self.config.update_source
                self._broker = BrokerAdmin(src.brokers, src.kafka_settings)
            return self._broker

    def reload(self, model: str, parameters: dict[str, str] | None = None) -> list[str]:
        """Reload every Triton model serving HPS model ``model``; the Triton names.

        Triton skips a load whose model files did not change, so the load carries the
        model's config with a fresh ``hps_reload_stamp`` parameter (and ``parameters``):
        every instance is then replaced.
        """
        self.config.model(model)
        names = [s.triton_name for s in served_models(self.config) if s.hps_model == model]
        for name in names:
            self.triton.reload(name, parameters)
        return names

    def close(self) -> None:
        self.jobs.close()
        self.reset_reader()
        with self._lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()

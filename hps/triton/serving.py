"""What a serving process does with a ps.json before it answers requests.

- :func:`serving_config` reads the ps.json as served: relative paths resolved against the
  directory ``hps serve`` started in, the L2 as the file was read (``multi_process_hash_map``
  when a model runs several instances and the file names no volatile_db type: one L2 per
  node, not one per Triton process; :meth:`hps.config.VolatileDBConfig.for_instances`) in a
  segment named after the deployment's L3 path unless the file names one
  (:meth:`hps.config.VolatileDBConfig.for_deployment`), and the models added or removed at
  runtime (:mod:`hps.versions.models`); a shared L2 with too few table entries for them is
  refused (:func:`hps.topology.check_shared_l2_tables`), and so is a warm-up file
  (``hps_cache.frequency_file``, ``warmup_keyset``) that is not there.
- :func:`prepare_tables` brings L3 (and a shared L2) up to date with the tables named by
  ``sparse_files`` (:func:`hps.loading.imports.import_tables`), which is also how a reload through
  Triton's model-control API picks up retrained tables.
- :func:`fill_l2` fills an L2 that lives and dies with the serving processes (an in-process
  ``hash_map``, or the node's ``multi_process_hash_map``) per ``initial_cache_rate``
  (every row when there is no L3).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hps.cache.warmup import warmup_path
from hps.config import ModelConfig, PSConfig, load_config
from hps.ctr.network import check_dense_inputs
from hps.errors import ConfigError, UnknownTableError
from hps.loading.imports import ImportRecord, import_lock, import_tables, sparse_sources
from hps.loading.loader import Loader
from hps.lookup import LookupSession
from hps.startup import fill_table_from_l3
from hps.topology import check_shared_l2_tables, l2_placement, topology
from hps.types import JSON
from hps.versions import VersionRegistry
from hps.versions.models import served_config

log = logging.getLogger(__name__)


def _absolute(path: str, base: Path) -> str:
    return path if not path or os.path.isabs(path) else str((base / path).resolve())


def serving_config(path: str | Path, base_dir: str | Path | None = None) -> PSConfig:
    """The ps.json at ``path`` as a serving process uses it (see the module docstring)."""
    return served_now(deployment_config(path, base_dir))


def served_now(config: PSConfig) -> PSConfig:
    """A :func:`deployment_config` with the models served now (those added or removed at
    runtime: :func:`hps.versions.models.served_config`), checked to fit a shared L2."""
    several = any(m.hps_instances > 1 for m in config.models)
    if several and l2_placement(config) == "process":
        log.warning("volatile_db %s is per process: each instance holds its own L2",
                    config.volatile_db.type)  # fmt: skip
    served = served_config(config)
    check_shared_l2_tables(served)  # before anything is imported or started
    return served


def deployment_config(path: str | Path, base_dir: str | Path | None = None) -> PSConfig:
    """The ps.json at ``path`` with its paths resolved and this deployment's L2 segment, its
    own models only (:func:`hps.versions.models.served_config` of it: the models served now,
    with those added or removed at runtime)."""
    config = load_config(path)
    base = Path(base_dir or os.getcwd())
    models = [
        m.model_copy(
            update={
                "sparse_files": [_absolute(p, base) for p in m.sparse_files],
                "dense_file": _absolute(m.dense_file, base),
                "network_file": _absolute(m.network_file, base),
                "hps_cache": m.hps_cache.model_copy(
                    update={
                        k: _absolute(v, base)
                        for k in ("frequency_file", "warmup_keyset")
                        if (v := getattr(m.hps_cache, k))
                    }
                ),
            }
        )
        for m in config.models
    ]
    update: JSON = {"models": models}
    l3_path = _absolute(config.persistent_db.path, base)
    if config.persistent_db.type != "disabled":
        update["persistent_db"] = config.persistent_db.model_copy(update={"path": l3_path})
    # this deployment's shared L2 segment: named after the L3 path as resolved here, which
    # every process of the deployment resolves alike (hps.config.databases)
    # (its type was decided when the file was read: VolatileDBConfig.for_instances)
    vdb = config.volatile_db.for_deployment(l3_path)
    update["volatile_db"] = vdb
    for m in models:
        if m.serves_ctr:
            check_dense_inputs(m)
        _check_warmup_files(config.source, m)
    return config.model_copy(update=update)


def _check_warmup_files(source: str, model: ModelConfig) -> None:
    """Each table's ``hps_cache.frequency_file`` and ``warmup_keyset`` (``{model}`` and
    ``{table}`` replaced, as the warm-up reads them) must be a file, where the model has an
    L1 to warm: a ConfigError before anything starts, not a failed load per instance."""
    cfg = model.hps_cache
    if not model.gpucache or cfg.capacity == 0:
        return
    for key in ("frequency_file", "warmup_keyset"):
        template = getattr(cfg, key)
        if not template:
            continue
        for spec in model.tables:
            path = Path(warmup_path(template, model.model, spec.table))
            if not path.is_file():
                what = "is a folder, not a file" if path.is_dir() else "no such file"
                raise ConfigError(f"{source}: model {model.model}: hps_cache.{key} {path}: {what}")


def only_model(config: PSConfig, model: str) -> PSConfig:
    """``config`` restricted to one model (what one Triton model's processes open)."""
    return config.model_copy(update={"models": [config.model(model)]})


def prepare_tables(
    config: PSConfig, models: list[str] | None = None, *, progress: bool = False
) -> dict[str, int]:
    """Import new or changed sparse files into L3 and a shared L2; rows imported per table.

    Only version 1 of a ps.json model (its own entry) is imported here, and only while it
    is the live one: a later version, or a model added at runtime, was imported when it was
    added (:mod:`hps.versions`) and needs its files no more, and a version 1 kept for
    rollback below a later live one is the snapshot it was (a retrain of its files since is
    not imported into it)."""
    registry = VersionRegistry(config)
    runtime = set(registry.runtime_models())
    models = [
        m.model
        for m in config.models
        if (models is None or m.model in models)
        and m.version == 1
        and m.model not in runtime
        and _live(registry, m.model) == 1
    ]
    return import_tables(
        config, topology(config), sparse_sources(config, models), progress=progress
    )


def _live(registry: VersionRegistry, model: str) -> int | None:
    try:
        return registry.live(model)
    except UnknownTableError:  # removed
        return None


def fill_l2(session: LookupSession, config: PSConfig, model: ModelConfig) -> int:
    """Fill an L2 that belongs to this process or node from the sparse files; rows inserted.

    An in-process L2 is filled by every process; a ``multi_process_hash_map`` by the first
    process of the node that finds a table empty in it. A server's L2 is filled at import.
    """
    topo = topology(config)
    if topo.l2_filled_by != "serving" or not model.sparse_files:
        return 0
    tiers = session.tiers
    share = config.volatile_db.initial_cache_rate
    l2 = tiers.volatile
    assert l2 is not None
    if tiers.persistent is not None:
        # From L3 when there is one: it holds the imports and deletes made since the files
        # (hps admin), which a reload must not undo, and a model version's rows whose
        # files may be gone. A failure is logged and shown in /readyz as degraded; L3
        # answers what L2 lacks.
        tables = [spec.name for spec in model.tables]

        def fill(table: str) -> int:
            return fill_table_from_l3(tiers, table, share, topo.state_dir)
    else:
        loader = Loader(tiers, "fill", share, l3=False)
        sources = {s.spec.name: s for s in sparse_sources(config, [model.model])}
        tables = list(sources)
        record = ImportRecord(topo.state_dir) if topo.state_dir is not None else None

        def fill(table: str) -> int:
            source = sources[table]
            # Without L3 the files are this version's only copy: files changed since its
            # import (a retrain written over them) would be served as this version. Files
            # merely copied (another stamp) hold the content recorded (the same digest).
            if (
                record is not None
                and table in record.tables
                and not record.current(source)
                and record.digest(table) != source.digest()
            ):
                raise ConfigError(
                    f"{table}: its files {[str(f) for f in source.files]} changed since model "
                    f"{model.model} version {model.version} was imported from them, and this "
                    "node keeps no other copy of its rows (no L3): import the new files as "
                    "a new version, or give L3 a path to keep versions in"
                )
            return loader.load(source)

    if topo.l2 == "process":
        return sum(fill(t) for t in tables)
    assert topo.state_dir is not None  # a node's L2 always has one
    with import_lock(topo.state_dir):
        return sum(fill(t) for t in tables if l2.size(t) == 0)

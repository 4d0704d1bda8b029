"""Where each part of HPS runs for a given ps.json, decided once.

:func:`topology` turns a config into a :class:`Topology`; every process that needs a
placement decision (``build_session``, a Triton model process, the update runtime, the
loader, ``hps plan``, the control plane, the Helm chart's tests) reads it from there instead
of looking at backend type names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from hps.config import ModelConfig, PSConfig
from hps.config.segment import MAX_TABLES
from hps.errors import ConfigError
from hps.tiers import AccessMode, Placement, placement_of

UpdateApplier = Literal["none", "embedded", "consumer"]
"""Who applies Kafka updates to L2/L3: nobody (no update source), each serving process to
its own in-process L2 (``embedded``), or ``hps consume`` (shared L2 and L3)."""

L1Refresh = Literal["none", "applier", "listener", "journal"]
"""How serving L1s learn of updates: no updates, their own applier (``embedded``), their own
listener of the topics, or ``hps consume`` through the node's change journal (one update
stream per node: ``update_source.hps_l1_refresh``; needs a node state folder)."""


@dataclass(frozen=True)
class ModelTopology:
    """How the serving processes of one model are laid out."""

    model: str
    instances: int  # Triton instances: one process each, each with its own L1
    l1: bool  # whether those processes keep an L1 cache
    l3_mode: AccessMode | None  # how each serving process opens L3 (None: no L3)
    l3_fallback: AccessMode | None  # when the writer's lock is held elsewhere (a reload)
    ctr_l3_mode: AccessMode | None  # how the CTR twin's processes open L3 (None: no twin/L3)


@dataclass(frozen=True)
class Topology:
    """What runs where for one ps.json (see docs/architecture.md)."""

    l2: Placement | None  # None: no L2
    l3: bool
    updates: UpdateApplier
    l2_filled_by: Literal["none", "serving", "import"]  # who loads sparse files into L2
    l1_refresh: L1Refresh  # how serving L1s learn of updates
    state_dir: Path | None  # where the import lock and record live (None: nothing shared)
    models: tuple[ModelTopology, ...]

    def model(self, name: str) -> ModelTopology:
        for m in self.models:
            if m.model == name:
                return m
        raise KeyError(name)

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["state_dir"] = str(self.state_dir) if self.state_dir else None
        return out


def l2_placement(config: PSConfig) -> Placement | None:
    vtype = config.volatile_db.type
    return None if vtype == "disabled" else placement_of(vtype)


def topology(config: PSConfig) -> Topology:
    """The placement of every part for ``config`` (as served: see hps.triton.serving)."""
    l2 = l2_placement(config)
    l3 = config.persistent_db.type != "disabled"
    kafka = config.update_source.enabled
    updates: UpdateApplier = "none" if not kafka else "embedded" if l2 == "process" else "consumer"
    if l2 in ("process", "node"):
        filled: Literal["none", "serving", "import"] = "serving"
    else:
        filled = "import" if l2 == "server" else "none"
    if l3:
        state: Path | None = Path(config.persistent_db.path)
    elif l2 in ("node", "server"):
        state = Path(config.source).with_suffix("")
    else:
        state = None
    return Topology(
        l2=l2,
        l3=l3,
        updates=updates,
        l2_filled_by=filled,
        l1_refresh=_l1_refresh(config, updates, state),
        state_dir=state,
        models=tuple(_model(m, l3, updates) for m in config.models),
    )


def shared_l2_tables(config: PSConfig, versions: int = 1) -> dict[str, int]:
    """Table entries each model takes in the node's ``multi_process_hash_map`` segment with
    ``versions`` of its versions held (at most its ``hps_keep_versions``): one per table and
    version, three where the tables' update versions are kept in L2 beside them (Kafka
    updates and no L3: :mod:`hps.tiers.versions`). Empty for another L2."""
    if config.volatile_db.type != "multi_process_hash_map":
        return {}
    per_table = 3 if config.update_source.enabled and config.persistent_db.type == "disabled" else 1
    return {
        m.model: len(m.tables) * min(versions, m.hps_keep_versions) * per_table
        for m in config.models
    }


def check_shared_l2_tables(config: PSConfig) -> None:
    """A :class:`ConfigError` when the models' tables cannot all have an entry in the node's
    ``multi_process_hash_map`` segment (:data:`hps.config.segment.MAX_TABLES`): said
    before anything is imported or started (``hps plan``, ``hps import``, ``hps serve``),
    not by the segment once a process opens the table that does not fit. One version of
    each model is counted: further versions that do not fit beside it fail when they load
    (an activation leaves Triton on the old one); ``hps plan`` says how many fit
    (:func:`shared_l2_versions_note`)."""
    need = shared_l2_tables(config)
    if sum(need.values()) <= MAX_TABLES:
        return
    side = " x 3 (each with its 2 update-version side tables: Kafka and no L3)"
    parts = ", ".join(
        f"{m.model}: {len(m.tables)} tables" + (side if need[m.model] > len(m.tables) else "")
        for m in config.models
    )
    default = (
        ", the default when a model runs several instances and no volatile_db.type is named"
        if config.volatile_db.type_defaulted
        else ""
    )
    raise ConfigError(
        f"{config.source}: the node's shared L2 (volatile_db multi_process_hash_map{default}) "
        f"holds at most {MAX_TABLES} tables; the models need {sum(need.values())} ({parts}): "
        "serve fewer tables, or name another volatile_db.type (hash_map: one L2 per "
        "process; redis_cluster)"
    )


def shared_l2_versions_note(config: PSConfig) -> str | None:
    """What ``hps plan`` says when the models' kept versions (``hps_keep_versions``) would
    not all fit the segment's table entries (None: they fit, or another L2)."""
    kept = sum(shared_l2_tables(config, versions=1 << 30).values())
    if kept <= MAX_TABLES:
        return None
    return (
        f"the shared L2 holds {MAX_TABLES} tables: the models' kept versions need {kept}; "
        "a version activated beyond what fits fails to load (Triton stays on the version it "
        "served): lower hps_keep_versions or retire versions first"
    )


def _l1_refresh(config: PSConfig, updates: UpdateApplier, state: Path | None) -> L1Refresh:
    if updates == "none":
        return "none"
    if updates == "embedded":
        return "applier"
    if config.update_source.hps_l1_refresh == "journal" and state is not None:
        return "journal"
    return "listener"


def _model(model: ModelConfig, l3: bool, updates: UpdateApplier) -> ModelTopology:
    mode: AccessMode | None
    fallback: AccessMode | None = None
    if not l3:
        mode = None
    elif updates == "none":
        mode = "secondary"  # the control plane writes L3; instances follow (change journal)
    elif updates == "embedded" and model.hps_instances == 1:
        mode, fallback = "read_write", "secondary"  # this process applies updates to L3
    else:
        mode = "secondary"  # hps consume writes; instances follow it
    # The CTR twin (<model>_ctr) never writes L3: the writer, if one, is decided above, so
    # the twin does not race the embedding model's process for the lock at start-up.
    twin: AccessMode | None = "secondary" if l3 and model.serves_ctr else None
    return ModelTopology(model.model, model.hps_instances, model.gpucache, mode, fallback, twin)


def describe(topo: Topology) -> list[str]:
    """Lines for ``hps plan``: what runs where."""
    l2 = {
        None: "none",
        "process": "in each serving process (filled by it)",
        "node": "shared memory, one per node (filled by its first serving process)",
        "server": "a server shared by every node (filled by hps import / serve start-up)",
        "disk": "on disk",
    }[topo.l2]
    lines = [
        f"L2: {l2}",
        f"L3: {'RocksDB on this node' if topo.l3 else 'none'}",
        "updates: "
        + {
            "none": "none (no update_source)",
            "embedded": "applied by each serving process to its own L2 (and L3 if it writes it)",
            "consumer": "applied by hps consume to L2 and L3",
        }[topo.updates],
    ]
    if topo.updates == "consumer":
        lines.append(
            "serving L1s: "
            + {
                "listener": "each serving process listens to the topics",
                "journal": "told by hps consume through the node's change journal",
            }[topo.l1_refresh]
        )
    if topo.state_dir is not None:
        lines.append(f"import lock and record: beside {topo.state_dir}")
    for m in topo.models:
        l3: str = m.l3_mode or "-"
        if m.l3_fallback:
            l3 += f" (else {m.l3_fallback})"
        twin = f"; {m.model}_ctr: L3 opened {m.ctr_l3_mode}" if m.ctr_l3_mode else ""
        lines.append(
            f"model {m.model}: {m.instances} instance(s), L1 {'per process' if m.l1 else 'off'}, "
            f"L3 opened {l3}{twin}"
        )
    return lines

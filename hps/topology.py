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
from hps.tiers import AccessMode, Placement, placement_of

UpdateApplier = Literal["none", "embedded", "consumer"]
"""Who applies Kafka updates to L2/L3: nobody (no update source), each serving process to
its own in-process L2 (``embedded``), or ``hps consume`` (shared L2 and L3)."""

L1Refresh = Literal["none", "applier", "listener", "journal"]
"""How serving L1s learn of updates: no updates, their own applier (``embedded``), their own
listener of the topics, or ``hps consume`` through the node's change journal (one update
stream per node: ``update_source.hps_l1_refresh``; needs a node state folder)."""

SHARED_L2_DEFAULT = "multi_process_hash_map"
"""The L2 of a multi-instance model whose ps.json names no volatile_db type."""


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

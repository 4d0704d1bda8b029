"""A node's version record as it publishes it into a shared Redis L2 (one field per node of
the hash :mod:`hps.tiers.node_records`), and what the other nodes' records say.

Two readers: the consumer that feeds the shared L2 merges them (:mod:`hps.updates.shared_record`),
and a node that drops a version's rows leaves the shared L2's while another node holds that
version (:mod:`hps.versions.shared_rows`). A record published more than :data:`STALE_S` ago
(wall clock) is left out by both; one older than :data:`FORGET_S` is deleted.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from dataclasses import asdict, dataclass
from typing import cast, get_args

from hps.errors import HPSError
from hps.versions.registry import VersionInfo, VersionRegistry, VersionState

log = logging.getLogger(__name__)

STALE_S = 3600.0
FORGET_S = 86400.0
HOLDING: frozenset[VersionState] = frozenset({"loading", "ready", "live"})
"""States in which a node holds a version's rows (imports them, or may serve them)."""
IMPORTED: frozenset[VersionState] = frozenset({"ready", "live"})
"""States in which a node holds a version's rows whole (its import done)."""


@dataclass(frozen=True)
class ModelRecord:
    """One model as one node records it."""

    versions: dict[int, VersionInfo]
    removed: bool
    runtime: bool


@dataclass(frozen=True)
class NodeRecord:
    """What one node publishes: when, and its models."""

    at: float  # unix time of the publish (the node's clock)
    models: dict[str, ModelRecord]
    node: str = ""  # its field in the hash (set when read)

    def encode(self) -> str:
        models = {
            m: {"versions": [asdict(v) for v in r.versions.values()], "removed": r.removed,
                "runtime": r.runtime}
            for m, r in self.models.items()
        }  # fmt: skip
        return json.dumps({"at": self.at, "models": models})

    @classmethod
    def decode(cls, raw: bytes | str, node: str = "") -> NodeRecord:
        """ValueError when ``raw`` is not a record (written by another release, damaged)."""
        try:
            doc = json.loads(raw)
            models = {
                str(m): ModelRecord(
                    {int(v["version"]): _info(v) for v in r["versions"]},
                    bool(r["removed"]),
                    bool(r["runtime"]),
                )
                for m, r in doc["models"].items()
            }
            at = doc["at"]
            if not isinstance(at, int | float) or not math.isfinite(at):
                raise ValueError(f"bad publish time {at!r}")
            return cls(float(at), models, node)
        except (ValueError, TypeError, KeyError, AttributeError, HPSError) as exc:
            raise ValueError(f"not a version record: {exc}") from None

    def holds(self, model: str, version: int, states: frozenset[VersionState] = HOLDING) -> bool:
        """Whether this node holds ``version`` of ``model``: a model it serves (not removed)
        with that version in one of ``states``."""
        rec = self.models.get(model)
        info = None if rec is None or rec.removed else rec.versions.get(version)
        return info is not None and info.state in states


def _info(v: dict[str, object]) -> VersionInfo:
    """One version, checked as far as this release reads it (its entry validated)."""
    state, version, created, entry = v["state"], v["version"], v["created"], v["entry"]
    if state not in get_args(VersionState) or not isinstance(version, int) or version < 1:
        raise ValueError(f"bad version {version!r} ({state!r})")
    if not isinstance(created, int | float) or not math.isfinite(created) or created < 0:
        raise ValueError(f"bad import start {created!r}")
    if not isinstance(entry, dict):
        raise ValueError(f"version {version}: bad entry")
    fingerprint = v.get("fingerprint")  # absent from an older release's record: unknown
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise ValueError(f"version {version}: bad fingerprint {fingerprint!r}")
    info = VersionInfo(
        version, cast(VersionState, state), float(created), entry, fingerprint=fingerprint
    )
    info.model_config()  # pydantic's ValidationError is a ValueError
    return info


def node_name(registry: VersionRegistry) -> str:
    """This node's field in the hash: its host (a pod's name) and where its record is."""
    return f"{socket.gethostname()}:{registry.path}"


def node_record(registry: VersionRegistry) -> NodeRecord:
    """The node's record: each model of its ps.json or record, as :meth:`versions` reads it
    (a model never versioned: version 1, live, its ps.json entry)."""
    names = {m.model for m in registry.config.models} | set(registry.recorded_models())
    models = {
        m: ModelRecord(
            {v.version: v for v in registry.versions(m)}, registry.removed(m), registry.runtime(m)
        )
        for m in sorted(names)
    }
    return NodeRecord(time.time(), models)


def forgotten(raw: dict[bytes, bytes], now: float) -> list[bytes]:
    """The nodes whose records are older than :data:`FORGET_S`, or not records."""
    out = []
    for node, value in raw.items():
        try:
            if now - NodeRecord.decode(value).at > FORGET_S:
                out.append(node)
        except ValueError:
            continue  # damaged or of another release: left to the consumer to report
    return out


def holders(
    raw: dict[bytes, bytes],
    model: str,
    version: int,
    *,
    besides: str,
    now: float,
    states: frozenset[VersionState] = HOLDING,
) -> list[str]:
    """The nodes other than ``besides`` whose records, published in the last :data:`STALE_S`,
    hold ``version`` of ``model`` in one of ``states``. Only what a record says of that
    version is read: one whose entries this release would refuse (another release's) still
    says what it holds; one that is no record at all (damaged) is left out, with a
    warning."""
    return sorted(fingerprints(raw, model, version, besides=besides, now=now, states=states))


def fingerprints(
    raw: dict[bytes, bytes],
    model: str,
    version: int,
    *,
    besides: str,
    now: float,
    states: frozenset[VersionState] = HOLDING,
) -> dict[str, str | None]:
    """:func:`holders`, each with the fingerprint of the files it imported the version from
    (:attr:`VersionInfo.fingerprint`; None: unknown, a record of an older release)."""
    out: dict[str, str | None] = {}
    for field, value in raw.items():
        node = field.decode(errors="replace")
        if node == besides:
            continue
        try:
            at, held, fingerprint = _states(value, model, version)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            if node not in _UNREAD:  # once per node and process
                log.warning("node %r: %s is not a version record; left out", node, exc)
                _UNREAD.add(node)
            continue
        if now - at <= STALE_S and held in states:
            out[node] = fingerprint
    return out


_UNREAD: set[str] = set()  # nodes whose records were not ones, warned of


def _states(raw: bytes, model: str, version: int) -> tuple[float, str | None, str | None]:
    """A record's publish time, the state it gives ``version`` of ``model`` (None: not
    held, or the model removed) and that version's fingerprint (None: unknown), read
    without validating its entries: a record of a release whose entries this one would
    refuse still says what it holds."""
    doc = json.loads(raw)
    at = doc["at"]
    if not isinstance(at, int | float) or not math.isfinite(at):
        raise ValueError(f"bad publish time {at!r}")
    rec = doc["models"].get(model)
    if rec is None or rec["removed"]:
        return float(at), None, None
    found = [v for v in rec["versions"] if v["version"] == version]
    if not found:
        return float(at), None, None
    fingerprint = found[0].get("fingerprint")
    return float(at), str(found[0]["state"]), fingerprint if isinstance(fingerprint, str) else None

"""Version records shared through a Redis L2, for the one consumer that feeds it for every node.

Each serving node keeps its version record beside its L3 (:mod:`hps.versions.registry`) and
its own ``hps consume`` routes updates into that L3 by it. A Redis L2 that every node shares
and one consumer with no L3 feeds (``hps consume --versions-from-l2``: the Helm chart's
l2-updater) has no record of its own, so:

- each node's control plane publishes its record (:mod:`hps.versions.node_record`: every
  model it knows, each version's state, import start and entry) into one Redis hash
  (:mod:`hps.tiers.node_records`), a field per node, every :data:`PUBLISH_S` and within a
  second of a change (:class:`RecordPublisher`);
- that consumer merges the nodes' records (:func:`merge`) into its own record file, which
  every part of ``hps consume`` reads as a node's record (:class:`RecordFollower`), every
  :data:`FOLLOW_S`.

The merge gives the shared L2's version ``n`` what ``n`` gets in some node's L3. An untagged
message goes to the union over nodes of what each routes it to (its live version and the
ready ones above it): those versions are merged ``live``. Any other version takes the most
advanced state a node gives it (ready > loading > retired): a tagged message is applied once
some node has it ready, and replayed to it when the first node makes it ready (from the
earliest import start of the nodes'). A model is removed when every node that names it
removed it. A node that has not published for ``STALE_S`` is left out (long enough for
a control plane's restart: the versions only it serves keep their updates meanwhile); with
no node left, the last merge stands. Records older than ``FORGET_S`` are deleted. A
record that is not one (damaged, or of a release whose entries this one cannot read) is left
out, with a warning.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from typing import cast

from hps.config import PSConfig
from hps.errors import ConfigError, HPSError
from hps.tiers.node_records import NodeRecords
from hps.topology import topology
from hps.types import JSON
from hps.updates import metrics
from hps.updates.routing import Point, start_ms, targets
from hps.versions.node_record import (
    STALE_S,
    ModelRecord,
    NodeRecord,
    forgotten,
    node_name,
    node_record,
)
from hps.versions.registry import VersionRegistry, VersionState
from hps.versions.shared_rows import release

log = logging.getLogger(__name__)

PUBLISH_S = 5.0
FOLLOW_S = 2.0
MERGED = "hps:merged-from-nodes"
"""The key marking a record as a merge (its value: the nodes merged): never a model name."""
_RANK: dict[VersionState, int] = {"retired": 0, "loading": 1, "ready": 2, "live": 3}


def merge(nodes: Iterable[NodeRecord]) -> dict[str, JSON]:
    """The nodes' records as one record document (the registry's file format)."""
    by_model: dict[str, list[ModelRecord]] = {}
    for node in nodes:
        for model, rec in node.models.items():
            by_model.setdefault(model, []).append(rec)
    out: dict[str, JSON] = {}
    for model, recs in sorted(by_model.items()):
        serving = [r.versions for r in recs if not r.removed]
        held_by = serving or [r.versions for r in recs]
        untagged: set[int] = set()
        for versions in serving:
            points = {n: Point(v.state, start_ms(v.created)) for n, v in versions.items()}
            untagged.update(targets(model, points, None, 0))
        merged: dict[str, JSON] = {}
        for n in sorted({n for versions in held_by for n in versions}):
            held = [versions[n] for versions in held_by if n in versions]
            best = max(held, key=lambda v: _RANK[v.state])
            starts = [v.created for v in held if v.state != "retired"] or [best.created]
            state: VersionState = "live" if n in untagged else best.state
            merged[str(n)] = asdict(replace(best, state=state, created=min(starts)))
        out[model] = {
            "versions": merged,
            "removed": not serving,
            "runtime": any(r.runtime for r in recs),
        }
    return out


def shared_l2_registry(config: PSConfig) -> VersionRegistry:
    """The registry of a node with a Redis L2 (ConfigError for another node)."""
    if topology(config).l2 != "server":
        raise ConfigError(
            f"{config.source}: version records are shared through a Redis L2; "
            f"volatile_db.type is {config.volatile_db.type!r}"
        )
    registry = VersionRegistry(config)
    if registry.path is None:  # a Redis L2 gives the node a state folder: never here
        raise ConfigError(f"{config.source}: the node keeps no version record")
    return registry


class _Every:
    """Calls ``tick`` every ``every`` seconds on a daemon thread until :meth:`close`; a
    failure is logged (once until it recovers) and the next tick tries again."""

    def __init__(self, what: str, every: float, tick: Callable[[], object]) -> None:
        self.what = what
        self.every = every
        self.tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=what, daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.tick()
            except Exception as exc:  # a dead thread would freeze what it keeps: log, go on
                if not self._failing:
                    log.warning("%s: %s; trying again every %gs", self.what, exc, self.every,
                                exc_info=not isinstance(exc, HPSError))  # fmt: skip
                self._failing = True
                continue
            if self._failing:
                log.info("%s: working again", self.what)
            self._failing = False

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


class RecordPublisher:
    """Publishes the node's record (:meth:`start`: from a thread of its own): when its file
    changes (checked every second), and every :data:`PUBLISH_S`; each time, drops the shared
    rows no node holds any more (:mod:`hps.versions.shared_rows`)."""

    def __init__(self, config: PSConfig) -> None:
        self.registry = shared_l2_registry(config)
        self.records = NodeRecords(config.volatile_db)
        self.loop = _Every("publishing this node's version record to Redis", 1.0, self.tick)
        self._pruned = False
        self.node = node_name(self.registry)
        self._stamp: object = object()
        self._last = 0.0
        self._releasing_failed = False

    def tick(self) -> None:
        stamp = self.registry.stamp()
        if stamp == self._stamp and time.monotonic() - self._last < PUBLISH_S:
            return
        self.publish()
        self._stamp = stamp

    def start(self) -> None:
        self.loop.start()

    def close(self) -> None:
        self.loop.close()
        self.records.close()

    def publish(self) -> None:
        """Publish the record; then drop the shared L2's rows of versions this node retired
        while another held them, that none holds any more (:func:`release`)."""
        record = node_record(self.registry)
        self.records.put(self.node, record.encode())
        self._last = time.monotonic()
        if not self._pruned:  # with no consumer following them, nothing else would
            self.records.forget(forgotten(self.records.all(), record.at))
            self._pruned = True
        try:
            release(self.registry.config)
        except Exception as exc:  # the publish is done: its cadence is not this one's
            if not self._releasing_failed:
                log.warning("dropping the shared L2's rows no node holds any more: %s; "
                            "trying again at each publish", exc,
                            exc_info=not isinstance(exc, HPSError))  # fmt: skip
            self._releasing_failed = True
        else:
            self._releasing_failed = False


class RecordFollower:
    """Keeps this node's record (the file its :class:`VersionRegistry` reads) the merge of
    the fresh records the nodes publish (:meth:`sync`; :meth:`start`: every
    :data:`FOLLOW_S` from a thread of its own)."""

    def __init__(self, config: PSConfig, *, stale_s: float = STALE_S) -> None:
        self.registry = shared_l2_registry(config)
        self.records = NodeRecords(config.volatile_db)
        self.loop = _Every("following the nodes' version records in Redis", FOLLOW_S, self.sync)
        self.stale_s = stale_s
        self._alone = False  # no fresh record at the last sync (logged)
        self.nodes = 0  # the nodes merged by the last sync
        self._written: JSON | None = None
        self._bad: set[bytes] = set()  # nodes whose record was not one, logged
        self._refuse_a_nodes_own_record()

    def _refuse_a_nodes_own_record(self) -> None:
        """A ConfigError when the record this consumer would keep the merge in is a serving
        node's own (a node with this ps.json and no L3 on this host): the merge would
        overwrite what that node recorded."""
        assert self.registry.path is not None
        try:
            doc = json.loads(self.registry.path.read_text())
        except (OSError, ValueError):
            return  # none yet (or unreadable: the merge replaces it)
        if isinstance(doc, dict) and doc and MERGED not in doc:
            raise ConfigError(
                f"{self.registry.path} is the version record of a serving node on this host "
                "(it shares this ps.json): --versions-from-l2 would overwrite it with the "
                "nodes' merge; give this consumer a ps.json of its own (another file name)"
            )

    def start(self) -> None:
        self.loop.start()

    def close(self) -> None:
        self.loop.close()
        self.records.close()

    def sync(self) -> bool:
        """Merge the fresh records into this node's record; whether that changed it."""
        raw = self.records.all()
        fresh = self._fresh(raw)
        self.nodes = len(fresh)
        metrics.RECORD_NODES.set(len(fresh))
        if not fresh:
            if self._alone:  # said once until a node publishes again
                return False
            self._alone = True
            if self._written is None:  # a first start beside the nodes: not a problem yet
                log.info("no serving node has published its version record yet: routing by "
                         "this node's record until one does")  # fmt: skip
            else:
                log.warning("no serving node published its version record in the last %gs: "
                            "routing by the last one", self.stale_s)  # fmt: skip
            return False
        self._alone = False
        doc: JSON = {**merge(fresh), MERGED: [r.node for r in fresh]}
        if doc == self._written:
            return False
        with self.registry.editing() as current:
            current.clear()
            current.update(cast(dict[str, JSON], doc))  # the marker's value is a list
        first = self._written is None
        self._written = doc
        log.log(logging.INFO if first else logging.DEBUG,
                "version record merged from %d nodes", len(fresh))  # fmt: skip
        return True

    def _fresh(self, raw: dict[bytes, bytes]) -> list[NodeRecord]:
        """The records published in the last ``stale_s`` (the nodes' clocks: the bound is
        far beyond their skew); those older than ``FORGET_S`` are deleted."""
        now = time.time()
        fresh = []
        for node, value in sorted(raw.items()):
            try:
                record = NodeRecord.decode(value, node.decode(errors="replace"))
            except ValueError as exc:
                if node not in self._bad:
                    log.warning("node %r: %s; left out", node.decode(errors="replace"), exc)
                    self._bad.add(node)
                continue
            self._bad.discard(node)
            if now - record.at <= self.stale_s:
                fresh.append(record)
        self.records.forget(forgotten(raw, now))
        return fresh


def follow(config: PSConfig) -> RecordFollower:
    """``hps consume --versions-from-l2``: a follower, synced once, then every
    :data:`FOLLOW_S`. A consumer with an L3 of its own is refused: its L3's versions are
    those its node records."""
    if config.persistent_db.type != "disabled":
        raise ConfigError(
            f"{config.source}: --versions-from-l2 is for a consumer that feeds a shared Redis "
            "L2 with no L3 of its own (persistent_db is set: its versions are those its node "
            "records)"
        )
    follower = RecordFollower(config)
    try:
        follower.sync()
    except HPSError as exc:  # Redis is down: route by the last merge until it is back
        log.warning("version records not read yet (%s); trying again every %gs", exc, FOLLOW_S)
    follower.start()
    return follower

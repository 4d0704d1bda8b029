"""Which model versions an update message goes to (docs/updates.md, "Model versions").

A message names a table by its topic (``hps_et.<model>.<table>``) and is untagged or tagged
with a model version (:attr:`hps.updates.codec.Decoded.model_version`). The versions of a
model are the node's record (:class:`hps.versions.VersionRegistry`); :func:`targets`
decides:

- **untagged** → the live version and every ``ready`` version above it (a version imported
  but not yet activated gets the stream from its readiness on);
- **tagged N** → N when it is ``ready`` or ``live``; nothing now when N is ``loading`` (the
  consumer replays the message once N is ready: :mod:`hps.updates.replay`); a dead letter
  when N is ``retired`` or unknown (``UnknownTableError``: the reason names the version);
- a version takes only the messages published from its import start on (its ``created``
  less :data:`SKEW_S`, against the message's timestamp): what came before is its
  snapshot's past. A tagged one from before is a dead letter; version 1 of a model that
  predates versions takes everything.

:class:`VersionWatch` keeps the record's versions, re-read only when its file changes (one
``stat`` per poll); :class:`Router` turns a decision into the tables of those versions, for
``hps consume`` (every version) or a serving instance (its own version only).

``hps consume`` also follows the node's **served models** (``follow``:
:func:`served_models`): a model added at runtime joins at the next reading of the record,
a removed one leaves it, and a message of a removed model is a dead letter (``model M was
removed``): the rows it would change are served by no one, and after a purge they no
longer exist, so applying it would leave rows behind that nothing drops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hps.errors import ConfigError, UnknownTableError
from hps.types import TableSpec
from hps.updates import codec
from hps.versions.registry import VersionInfo, VersionRegistry, VersionState

log = logging.getLogger(__name__)

SKEW_S = 5.0
"""How much earlier than a version's recorded import start (the node's clock) its messages
may be stamped (the broker's clock): the allowance for the two clocks' offset."""


@dataclass(frozen=True)
class Point:
    """One version of a model as routing sees it."""

    state: VersionState
    start_ms: int  # the earliest message timestamp it takes (0: every message)


def start_ms(created: float) -> int:
    """The earliest message timestamp (ms) a version imported at ``created`` takes."""
    return 0 if created <= 0 else max(0, int((created - SKEW_S) * 1000))


def targets(
    model: str, versions: Mapping[int, Point], tag: int | None, ts_ms: int
) -> tuple[int, ...]:
    """The versions of ``model`` a message (tagged ``tag``, stamped ``ts_ms``; 0: no
    timestamp) is applied to now; UnknownTableError when it goes to the dead-letter topic."""

    def since(n: int) -> bool:
        return ts_ms <= 0 or ts_ms >= versions[n].start_ms

    if tag is None:
        live = max((n for n, p in versions.items() if p.state == "live"), default=0)
        return tuple(
            n
            for n, p in sorted(versions.items())
            if (p.state == "live" or (p.state == "ready" and n > live)) and since(n)
        )
    point = versions.get(tag)
    if point is None:
        raise UnknownTableError(f"model {model} has no version {tag}")
    if point.state == "retired":
        raise UnknownTableError(f"model {model} version {tag} is retired")
    if not since(tag):
        raise UnknownTableError(
            f"model {model} version {tag} was begun after the message was published"
        )
    return () if point.state == "loading" else (tag,)


def served_models(
    registry: VersionRegistry, known: Iterable[str] = ()
) -> tuple[list[str], set[str]]:
    """The models the node serves (its ps.json's but those removed at runtime, and those
    added at runtime: :mod:`hps.versions.models`) and the removed ones among those and
    ``known``."""
    named = {m.model for m in registry.config.models}
    removed = {m for m in named | set(known) if registry.removed(m)}
    return sorted((named - removed) | set(registry.runtime_models())), removed


class VersionWatch:
    """The recorded versions of ``models``, re-read when the record's file changes.

    ``registry`` None: a fixed set, one live version per model (``static``). ``follow``:
    the models are the node's served ones (:func:`served_models`), read again with the
    record; ``removed`` holds those removed at runtime."""

    def __init__(
        self,
        registry: VersionRegistry | None,
        models: Iterable[str],
        static: Mapping[str, int] | None = None,
        *,
        follow: bool = False,
    ) -> None:
        self.registry = registry
        self.models = sorted(set(models))
        self.follow = follow and registry is not None
        self.removed: set[str] = set()
        self.points: dict[str, dict[int, Point]] = {
            m: {n: Point("live", 0)} for m, n in (static or {}).items()
        }
        self._infos: dict[str, dict[int, VersionInfo]] = {}
        self._stamp: object = object()  # equal to no stat result: the first refresh reads
        if registry is not None:
            self.refresh()

    @classmethod
    def static(cls, versions: Mapping[str, int]) -> VersionWatch:
        """Each model at one version, live (no record: tests, tools)."""
        return cls(None, versions, versions)

    def _stat(self) -> object:
        return None if self.registry is None else self.registry.stamp()

    def stale(self) -> bool:
        """Whether the record's file changed since the last read (one ``stat``)."""
        return self.registry is not None and self._stat() != self._stamp

    def refresh(self) -> bool:
        """Re-read the record if its file changed since the last read; whether it did."""
        if self.registry is None:
            return False
        stamp = self._stat()  # before the read: what is read is at least this new
        if stamp == self._stamp:
            return False
        try:
            models, removed = self.models, self.removed
            if self.follow:
                models, removed = served_models(self.registry, {*self.models, *self.removed})
            infos = {m: {v.version: v for v in self.registry.versions(m)} for m in models}
        except (ConfigError, UnknownTableError) as exc:
            # hand-edited into bad JSON, or replaced between two reads of this pass (a model
            # gone): keep the last reading; the next poll reads it again
            log.warning("model versions not re-read: %s", exc)
            return False
        self.models, self.removed = models, removed
        self._stamp = stamp
        self._infos = infos
        self.points = {
            m: {n: Point(v.state, start_ms(v.created)) for n, v in d.items()}
            for m, d in infos.items()
        }
        return True

    def tables(self, model: str, version: int) -> list[TableSpec]:
        """The tables of ``version`` of ``model`` as recorded (its namespace in every tier)."""
        info = self._infos.get(model, {}).get(version)
        if info is None:
            raise UnknownTableError(f"model {model} has no version {version}")
        return info.model_config().tables


class Router:
    """The tables an update message goes to, for one applier (or L1 listener).

    ``tables`` are the applier's own (their version is the model's live one without a
    record); ``own``: a serving instance, which applies what goes to the version of its
    tables only. Other versions' tables come from the record (``hps consume``). With a
    watch that follows the served models, the tables are those of every served model's
    versions (retired ones aside) that ``takes`` (whether some tier takes a table's
    updates), known again at each change of the record."""

    def __init__(
        self,
        tables: Mapping[str, TableSpec],
        watch: VersionWatch,
        *,
        own: bool = False,
        takes: Callable[[TableSpec], bool] = lambda spec: True,
    ) -> None:
        self.watch = watch
        self._takes = takes
        self._specs: dict[tuple[str, int], TableSpec] = {
            (s.qualified, s.version): s for s in tables.values()
        }
        self._known = {s.qualified for s in tables.values()}
        self.own: dict[str, int] | None = (
            {s.model: s.version for s in tables.values()} if own else None
        )
        if watch.follow:
            self._follow()

    @classmethod
    def fixed(cls, tables: Mapping[str, TableSpec]) -> Router:
        """Every message to ``tables`` at their version, taken as live (no record)."""
        watch = VersionWatch.static({s.model: s.version for s in tables.values()})
        return cls(tables, watch)

    def refresh(self) -> bool:
        """Re-read the record if it changed (and with it the served models); whether it did."""
        changed = self.watch.refresh()
        if changed and self.watch.follow:
            self._follow()
        return changed

    def _follow(self) -> None:
        self._known = {
            spec.qualified
            for model in self.watch.models
            for n, point in self.watch.points.get(model, {}).items()
            if point.state != "retired"
            for spec in self.watch.tables(model, n)
            if self._takes(spec)
        }

    def topics(self) -> list[str]:
        """The update topics of the tables this router knows."""
        return sorted(codec.topic_name(*name.split(".", 1)) for name in self._known)

    def route(
        self, model: str, table: str, tag: int | None, ts_ms: int, *, only: int | None = None
    ) -> list[TableSpec]:
        """The tables (one per version) a message goes to now, restricted to version
        ``only`` when given; UnknownTableError when it is a dead letter."""
        qualified = f"{model}.{table}"
        versions = self.watch.points.get(model)
        if model in self.watch.removed:
            raise UnknownTableError(f"model {model} was removed: its updates are not applied")
        if qualified not in self._known or versions is None:
            raise UnknownTableError(f"no configured table {qualified} for its topic")
        chosen = targets(model, versions, tag, ts_ms)
        if self.own is not None:
            only = self.own[model] if only is None else only
        return [self.spec(model, table, n) for n in chosen if only is None or n == only]

    def spec(self, model: str, table: str, version: int) -> TableSpec:
        """``<model>.<table>`` at ``version``."""
        qualified = f"{model}.{table}"
        spec = self._specs.get((qualified, version))
        if spec is None:
            found = [s for s in self.watch.tables(model, version) if s.table == table]
            if not found:
                raise UnknownTableError(f"model {model} version {version} has no table {table}")
            spec = self._specs[(qualified, version)] = found[0]
        return spec

    def version_tables(self, model: str, version: int) -> list[TableSpec]:
        """The tables of ``version`` this router knows topics of."""
        return [
            self.spec(model, s.table, version)
            for s in self.watch.tables(model, version)
            if s.qualified in self._known
        ]

    def own_starts(self) -> dict[str, int]:
        """The first message time (ms) to read each topic from for this instance's own
        version: its import start (left out: from the beginning)."""
        out: dict[str, int] = {}
        for (_, version), spec in self._specs.items():
            if self.own is not None and self.own.get(spec.model) != version:
                continue
            point = self.watch.points.get(spec.model, {}).get(version)
            if point is not None and point.start_ms > 0:
                out[codec.topic_name(spec.model, spec.table)] = point.start_ms
        return out

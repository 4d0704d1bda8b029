"""``hps consume`` follows the models the node serves (docs/updates.md, "Models added and
removed at runtime").

The models come from the node's version record (:func:`hps.updates.routing.served_models`),
re-read when its file changes (the :class:`~hps.updates.routing.Router`'s one ``stat`` per
poll). After each change, :meth:`ModelFollower.follow`, before the next poll:

- a model added at runtime (``POST /v1/models``): its tables' topics are subscribed (the
  group rebalances; a topic it never committed is read from its beginning, and a version
  takes only what was published since its import began); its tables are opened in the
  consumer's tiers at their first update (:meth:`hps.updates.applier.Applier.accept`);
- a removed model (``DELETE /v1/models/{model}``): its topics are no longer consumed and
  its tables are dropped from the applier; a message of it still in flight is a dead
  letter (``model M was removed``), whether or not it was purged.

A batch routed before a removal was read is applied as routed; one held up by a failing
tier drops the removed model's rows before each retry (:meth:`ModelFollower.drop_removed`),
so a purge that happened meanwhile is not undone.

A failed subscription (the broker away) is tried again before the next poll.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from hps.errors import BackendError, ConfigError, UnknownTableError
from hps.types import TableSpec, UpdateBatch
from hps.updates import metrics
from hps.updates.applier import Applier
from hps.updates.routing import Router

log = logging.getLogger(__name__)


class Subscriber(Protocol):
    """What following needs of the message source (:class:`hps.updates.source.MessageSource`
    in group mode)."""

    @property
    def topics(self) -> list[str]: ...
    @property
    def assignment(self) -> list[tuple[str, int]]: ...
    def subscribe(self, topics: Sequence[str]) -> None: ...


class ModelFollower:
    """Keeps ``source``'s subscription and ``applier``'s tables to ``router``'s models."""

    def __init__(
        self, router: Router, source: Subscriber, applier: Applier, *, drop_retired: bool = False
    ) -> None:
        self.router = router
        self.source = source
        self.applier = applier
        self.drop_retired = drop_retired
        self._drop_failed = False  # the last drop of retired versions' tables failed (logged)
        self.pending = False  # a change not yet followed (a failed subscription or drop)

    def follow(self, *, new_reading: bool = True) -> None:
        """Follow the router's current reading of the record (``new_reading``: one it had
        not followed yet, logged; else a retry of a failed subscription)."""
        watch = self.router.watch
        if new_reading:  # say what is routed to from now on
            log.info("version record: %s", "; ".join(
                f"{m}: " + ", ".join(f"{n} {p.state}" for n, p in sorted(points.items()))
                for m, points in sorted(watch.points.items())
            ) or "no model")  # fmt: skip
        dropped_all = not self.drop_retired or self._drop_retired()
        # (what a failed drop left is forgotten once it is dropped: the next try needs it)
        if dropped_all and (dropped := self.applier.forget(set(watch.removed))):
            log.info("stopped applying updates to %s (model removed)", ", ".join(dropped))
        subscribed = self._subscribe()
        self.pending = not (subscribed and dropped_all)

    def _drop_retired(self) -> bool:
        """Drop the tables this consumer wrote of versions now recorded retired; whether
        that succeeded. With ``drop_retired`` (``hps consume --versions-from-l2``): the
        retire that dropped them ran on a serving node, which this consumer learns of only
        when the node's record reaches it, so a batch may have landed after that drop."""
        watch = self.router.watch
        names = [
            spec.name
            for model, points in sorted(watch.points.items())
            for n, point in sorted(points.items())
            if point.state == "retired"
            for spec in watch.tables(model, n)
        ]
        registry = watch.registry
        # a purged model's versions are all retired (unreadable just now: the next reading)
        with contextlib.suppress(ConfigError, UnknownTableError):
            names += [
                spec.name
                for model in sorted(watch.removed)
                for info in ([] if registry is None else registry.versions(model))
                if info.state == "retired"
                for spec in info.model_config().tables
            ]
        try:
            dropped = self.applier.drop(names)
        except BackendError as exc:
            if not self._drop_failed:  # once until it succeeds
                log.warning("tables of retired versions not dropped (%s); trying again before "
                            "each poll", exc)  # fmt: skip
            self._drop_failed = True
            return False
        self._drop_failed = False
        if dropped:
            log.info("dropped what this consumer wrote into retired versions: %s",
                     ", ".join(dropped))  # fmt: skip
        return True

    def _subscribe(self) -> bool:
        """Subscribe to the router's topics; whether that succeeded."""
        wanted = self.router.topics()
        before = list(self.source.topics)
        if wanted != before:
            gone = sorted(set(before) - set(wanted))
            parts = [tp for tp in self.source.assignment if tp[0] in gone]
            try:
                self.source.subscribe(wanted)
            except BackendError as exc:
                log.warning("subscription not changed (%s); trying again", exc)
                return False
            for topic, partition in parts:  # no stale lag series for topics left
                with contextlib.suppress(KeyError):
                    metrics.CONSUMER_LAG.remove(topic, str(partition))
            log.info(
                "following the served models: consuming %d topics (added %s; left %s)",
                len(wanted),
                ", ".join(sorted(set(wanted) - set(before))) or "none",
                ", ".join(gone) or "none",
            )
        return True

    def drop_removed(self, updates: list[UpdateBatch]) -> list[UpdateBatch]:
        """``updates`` less those of models recorded removed, or of model versions recorded
        retired, since they were routed (read from the record itself: the router's reading
        is the next poll's to take). A retired version's tables were dropped: writing them
        again would leave rows that nothing drops."""
        registry = self.router.watch.registry
        if registry is None:
            return updates
        targets = {TableSpec.parse_name(u.table)[::2] for u in updates}  # (model, version)
        try:
            gone = {
                (m, v)
                for m, v in targets
                if registry.removed(m)
                or any(i.version == v and i.state == "retired" for i in registry.versions(m))
            }
        except (ConfigError, UnknownTableError):  # unreadable just now: as routed
            return updates
        if gone:
            names = ", ".join(f"{m} version {v}" for m, v in sorted(gone))
            log.info("dropping the updates of %s from a retried batch (removed or retired)", names)
        return [u for u in updates if TableSpec.parse_name(u.table)[::2] not in gone]

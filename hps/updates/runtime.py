"""Wiring: the ``hps consume`` service, the embedded applier and the L1 freshness listener.

Which one a serving process runs (:func:`start_updates`; the two live in
:mod:`hps.updates.embedded` and :mod:`hps.updates.listener`):

- **embedded** (``volatile_db`` is the in-process ``hash_map``): nothing outside the process
  can update its L2, so it runs the applier itself in a background thread: every partition
  from the beginning (its L2 starts empty), no consumer group, no commits; L3 too when this
  process opened it read-write. L1 is refreshed right after each apply.
- **shared** (Redis, or no L2): ``hps consume`` applies to L2/L3; the serving process only
  runs a listener that refreshes its L1 (:mod:`hps.updates.freshness`), or, with
  ``update_source.hps_l1_refresh: journal``, nothing: ``hps consume`` journals each batch it
  applied and the process's journal follower refreshes L1 from it (:mod:`hps.updates.announce`).

Either records into the ``recorder`` it is given (a serving process passes a
:class:`hps.updates.metrics.BufferedRecorder` that its Triton metrics drain): the embedded
applier its stages and each message's freshness once applied (L1 refreshed inside the
apply), the listener each message's freshness (:class:`hps.updates.freshness.Served`).

Model versions (:mod:`hps.updates.routing`): ``hps consume`` applies each message to every
version it goes to and replays to a version what it missed while loading
(:mod:`hps.updates.replay`); a serving instance of version v applies (or refreshes its L1
with) what goes to v only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hps.config import PSConfig
from hps.errors import ConfigError, HPSError
from hps.tiers import Tiers, VersionedRows
from hps.topology import topology
from hps.types import TableSpec
from hps.updates import codec
from hps.updates.applier import Applier, Listener, model_filter
from hps.updates.consumer import UpdateConsumer
from hps.updates.deadletter import DeadLetters
from hps.updates.following import ModelFollower
from hps.updates.freshness import L1Refresher, Ready, always_ready
from hps.updates.heartbeat import Heartbeat
from hps.updates.metrics import Recorder
from hps.updates.replay import Catchup, Replayer, Rollouts, record_path
from hps.updates.routing import Router, VersionWatch
from hps.updates.source import MessageSource

if TYPE_CHECKING:
    from hps.lookup import LookupSession

log = logging.getLogger(__name__)

RETRY_S = 1.0
REPEAT_LOG_EVERY = 60  # failures in a row between two log lines of a failing update thread
REPLAY_RECENT_S = 3600.0
"""``hps consume --versions-from-l2`` replays at its start to the versions imported in the
last hour (:class:`hps.updates.replay.Rollouts` ``recent_s``): its record of owed replays
lives in a folder a move of its pod loses."""


def update_tiers(config: PSConfig, tiers: Tiers, *, shared_only: bool) -> Tiers:
    """The tiers that take updates: a writable L3, and L2 unless ``shared_only`` and it lives
    inside each serving process."""
    l2 = tiers.volatile is not None
    if l2 and shared_only and topology(config).l2 == "process":
        log.warning(
            "volatile_db %r lives inside each serving process: hps consume applies updates to "
            "L3 only; serving processes apply them to their own L2",
            config.volatile_db.type,
        )
        l2 = False
    l3 = tiers.persistent is not None and tiers.persistent.writable
    return tiers.subset(l2=l2, l3=l3)


def build_applier(
    config: PSConfig,
    session: LookupSession,
    *,
    shared_only: bool,
    listeners: list[Listener] | None = None,
    recorder: Recorder | None = None,
) -> Applier:
    """An Applier over the session's tiers; ``shared_only`` skips an in-process L2."""
    applier = Applier(
        session.tables,
        update_tiers(config, session.tiers, shared_only=shared_only),
        volatile_models=model_filter(config.volatile_db.update_filters),
        persistent_models=model_filter(config.persistent_db.update_filters),
        listeners=listeners or [],
        recorder=recorder,
    )
    if not applier.tables:
        raise ConfigError(
            f"{config.source}: no table takes online updates (check volatile_db, persistent_db "
            "and their update_filters)"
        )
    return applier


def versioned_table(config: PSConfig, tiers: Tiers, spec: TableSpec) -> VersionedRows:
    """The table's rows and update versions where ``hps consume`` keeps them (the same tiers
    and ``update_filters`` as :func:`build_applier`): what ``hps repair-versions`` resets."""
    route = update_tiers(config, tiers, shared_only=True).versioned(
        spec,
        l2=model_filter(config.volatile_db.update_filters)(spec.model),
        l3=model_filter(config.persistent_db.update_filters)(spec.model),
    )
    if route is None:
        raise ConfigError(f"{config.source}: no tier takes the updates of {spec.name}")
    return route


def topics_of(tables: Mapping[str, TableSpec]) -> list[str]:
    return sorted(codec.topic_name(s.model, s.table) for s in tables.values())


def consumed_models(config: PSConfig) -> Callable[[str], bool]:
    """Whether ``hps consume`` applies a model's updates to a tier the serving processes
    read (a shared L2, or L3), by ``update_filters``: what their L1 listeners follow, so
    that L1 never serves an update L2 and L3 never took."""
    shared_l2 = topology(config).l2 not in (None, "process")
    l2 = model_filter(config.volatile_db.update_filters)
    l3 = model_filter(config.persistent_db.update_filters)
    l3_on = config.persistent_db.type != "disabled"
    return lambda model: (shared_l2 and l2(model)) or (l3_on and l3(model))


def version_router(
    config: PSConfig,
    tables: Mapping[str, TableSpec],
    *,
    own: bool,
    follow: Callable[[TableSpec], bool] | None = None,
) -> Router:
    """A router over the node's version record for ``tables`` (``own``: a serving
    instance, its tables' version only); ``follow`` (``hps consume``): the tables of the
    node's served models that it takes, followed at runtime."""
    from hps.versions.registry import VersionRegistry

    models = {s.model for s in tables.values()}
    watch = VersionWatch(VersionRegistry(config), models, follow=follow is not None)
    return Router(tables, watch, own=own, takes=follow or (lambda spec: True))


def check_enabled(config: PSConfig) -> None:
    if not config.update_source.enabled:
        raise ConfigError(
            f"{config.source}: update_source.type is 'null'; set it to 'kafka_message_queue'"
        )


def build_service(
    config: PSConfig,
    session: LookupSession,
    heartbeat: Heartbeat | None = None,
    *,
    versions_from_l2: bool = False,
) -> UpdateConsumer:
    """The ``hps consume`` loop over ``session`` (built without L1), in the consumer group.

    It follows the node's served models (:mod:`hps.updates.following`): build ``session``
    from the ps.json as served (:func:`consumed_config`). ``versions_from_l2``: the record
    is the serving nodes' merged (:mod:`hps.updates.shared_record`), whose retires drop
    rows elsewhere: this consumer drops what it wrote of the versions retired."""
    check_enabled(config)
    us = config.update_source
    applier = build_applier(config, session, shared_only=True, listeners=_announcers(config))
    router = version_router(config, applier.tables, own=False, follow=applier.takes)
    kafka_conf = us.kafka_settings
    source = MessageSource(
        us.brokers,
        router.topics(),
        mode="group",
        group_id=us.hps_group_id,
        config=kafka_conf,
    )
    dead = (
        DeadLetters(us.brokers, us.hps_dead_letter_topic, kafka_conf)
        if (us.hps_dead_letter_topic)
        else None
    )
    heartbeat = heartbeat or Heartbeat()
    from hps.startup import watch_shared_l2  # a replaced shared-memory L2: refill it

    if (l2_watch := watch_shared_l2(session, config, role="consumer")) is not None:
        heartbeat.watch(l2_watch)
    assert router.watch.registry is not None
    catchup = Catchup(
        router,
        Rollouts(
            record_path(router.watch.registry, us.hps_group_id),
            recent_s=REPLAY_RECENT_S if versions_from_l2 else 0.0,
        ),  # fmt: skip
        Replayer(us.brokers, us.hps_group_id, kafka_conf),
        applier.accept,
        max_rows=us.max_batch_size,
        max_version_ahead_s=us.hps_max_version_ahead_s,
    )
    return UpdateConsumer(
        source, applier, us, dead_letters=dead, heartbeat=heartbeat, router=router,
        catchup=catchup,
        follower=ModelFollower(router, source, applier, drop_retired=versions_from_l2),
    )  # fmt: skip


def unshared_version_record(config: PSConfig, record: Path | None) -> str | None:
    """What is wrong when ``hps consume`` feeds a shared L2 (Redis) with no L3 of its own
    and its version record is not where the ps.json puts it (a read-only folder: the
    Helm chart's L2 updater): no serving node writes that record, so its models are at
    version 1 here (None when the record is shared)."""
    topo = topology(config)
    if topo.l3 or topo.l2 != "server" or topo.state_dir is None or record is None:
        return None
    if record.parent == topo.state_dir.parent:
        return None
    return (
        f"this consumer keeps its version record in {record}, which no serving node writes "
        "unless it runs on this host with this ps.json: its shared L2 then takes updates for "
        "version 1 of each model only, and a version rolled out on the serving nodes gets "
        "none in it; give --versions-from-l2 to follow the records the serving nodes "
        "publish (docs/versions.md, 'A shared L2 fed by its own consumer')"
    )


def _announcers(config: PSConfig) -> list[Listener]:
    """``hps_l1_refresh: journal``: each applied batch goes to the node's change journal."""
    topo = topology(config)
    if topo.l1_refresh != "journal":
        return []
    from hps.updates.announce import JournalAnnouncer
    from hps.updates.journal import Journal, journal_dir

    assert topo.state_dir is not None  # topology: journal needs the node's state folder
    return [JournalAnnouncer(Journal(journal_dir(topo.state_dir)))]


def consumed_config(config: PSConfig) -> PSConfig:
    """The ps.json as ``hps consume`` applies it: the models the node serves, those added
    at runtime included and those removed left out (:func:`hps.versions.models.served_config`),
    each ps.json model's version 1 as recorded once versions were used (its tables as they
    were imported: a ps.json edited since for a retrain in another row format or dimension
    describes a later version, not the rows version 1 holds)."""
    from hps.versions import VersionRegistry
    from hps.versions.models import served_config

    served = served_config(config)
    registry = VersionRegistry(served)
    models = []
    for m in served.models:
        first = next((v for v in registry.versions(m.model) if v.version == 1), None)
        if m.version == 1 and first is not None and first.state in ("ready", "live"):
            m = first.model_config()
        models.append(m)
    return served.model_copy(update={"models": models})


class UpdateThread:
    """A background update thread: ``step(stop)`` again and again until :meth:`stop`
    (which finishes the step under way and joins), then ``close()``.

    A step that raises does not end the thread, whatever it raised: the error is logged
    (an unforeseen one with its traceback) on the first failure in a row and every
    :data:`REPEAT_LOG_EVERY` after, counted in ``errors``, and the next step comes
    :data:`RETRY_S` later. A step leaves what it could not finish as it would be found
    again (the consumer reads its batch again; the listener drops L1)."""

    def __init__(
        self,
        name: str,
        step: Callable[[threading.Event], None],
        refresher: L1Refresher | None = None,
        *,
        close: Callable[[], None] | None = None,
    ) -> None:
        self.refresher = refresher  # for introspection: pending re-reads, dropped keys
        self.stop_event = threading.Event()
        self.error: BaseException | None = None  # the last one
        self.errors = 0
        self._step, self._close = step, close
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        name, in_a_row = self.thread.name, 0
        try:
            while not self.stop_event.is_set():
                try:
                    self._step(self.stop_event)
                    in_a_row = 0
                except Exception as exc:  # noqa: BLE001 - the thread outlives any step
                    self.error, self.errors = exc, self.errors + 1
                    if in_a_row % REPEAT_LOG_EVERY == 0:
                        again = f" ({in_a_row + 1} in a row)" if in_a_row else ""
                        if isinstance(exc, HPSError):
                            log.warning("%s: %s%s; retrying", name, exc, again)
                        else:
                            log.exception("%s: unexpected error%s; retrying", name, again)
                    in_a_row += 1
                    self.stop_event.wait(RETRY_S)
        except BaseException as exc:  # surfaced through .error and the log
            self.error = exc
            log.exception("%s stopped", name)
        finally:
            if self._close is not None:
                self._close()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout_s)


def timed_pass2(
    recorder: Recorder,
    refresher: L1Refresher,
    ready: Ready = always_ready,
) -> None:
    """Pass 2 of the L1 refresh, timed (stage ``l1_reread``) when it re-read something: it
    runs in the update thread, between polls."""
    start = time.perf_counter()
    if refresher.run_due(ready):
        recorder.stage("l1_reread", time.perf_counter() - start)


def start_updates(
    session: LookupSession, config: PSConfig, recorder: Recorder | None = None
) -> UpdateThread | None:
    """What a serving process calls: the embedded applier or the L1 listener (or nothing).

    ``recorder`` takes the stage timings and each update's freshness in this process."""
    from hps.updates.embedded import start_background_applier
    from hps.updates.listener import start_l1_listener

    topo = topology(config)
    if topo.updates == "none":
        return None
    if topo.updates == "embedded":
        return start_background_applier(session, config, recorder)
    if not session.caches or topo.l1_refresh == "journal":  # journal: its follower refreshes
        return None
    consumed = consumed_models(config)
    if not any(consumed(session.tables[name].model) for name in session.caches):
        return None  # no cached table takes updates (update_filters)
    return start_l1_listener(session, config, recorder)

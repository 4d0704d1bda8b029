"""The update loop: poll a batch, dead-letter what cannot be decoded, apply, then commit.

Semantics (docs/updates.md):

- A batch is one message waited for up to ``poll_timeout_ms``, plus messages already fetched
  until it holds ``max_batch_size`` rows (keys), ``max_batch_size`` messages or
  :data:`MAX_BATCH_BYTES` of payload; it may end a few messages over. (Messages without
  rows, a backlog of HugeCTR beacons or of dead letters, would otherwise make one batch of
  millions: its memory unbounded, its heartbeat stale, nothing stored till its end.)
- It is applied to L3 and L2 (:class:`hps.updates.applier.Applier`, durably), and only then
  are its offsets stored; stored offsets are committed after at most ``max_commit_interval``
  batches, whenever a poll finds nothing, on a rebalance and on shutdown. A crash replays at
  most those batches, and the per-key versions make the replay change nothing.
- A message that cannot be decoded (or names an unknown table, has the wrong dimension,
  non-finite values or values its table's row format cannot hold: beyond float16's range)
  goes to the dead-letter topic with the reason; the rest is applied.
- When a tier fails, the same batch is retried after ``failure_backoff_ms``, doubling up to
  ``MAX_BACKOFF_S``: nothing is skipped. A stop request during the backoff leaves the batch
  uncommitted (it is redelivered on restart).
- Every poll and every retry beats the :class:`~hps.updates.heartbeat.Heartbeat`: the
  process's liveness (``/healthz``, the heartbeat file) stops when the loop stalls.
- Each message goes to the tables of the model versions :class:`~hps.updates.routing.Router`
  chooses (the node's version record, re-read when its file changes: one ``stat`` per
  poll); a message for a retired or unknown version is a dead letter. When a version
  becomes ready, the messages it missed while it was loading are replayed to it before the
  next poll (:mod:`hps.updates.replay`). ``hps consume`` follows the served models too
  (:mod:`hps.updates.following`): a model added at runtime is subscribed, a removed one left.
- Each message's publish timestamp (its Kafka timestamp) travels in the batch's ``extras``
  (``published_ns``); the loop records the stages ``delivery``, ``batch``, ``decode`` and
  ``applied`` (:data:`hps.updates.metrics.STAGES`) and, where the loop serves lookups itself
  (the embedded applier, whose listeners refresh L1 inside the apply), each message's
  freshness.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from hps.config import UpdateSourceConfig
from hps.errors import BackendError, ConfigError, FormatError, RequestError, UnknownTableError
from hps.types import TableSpec, UpdateBatch
from hps.updates import metrics
from hps.updates.applier import Applier
from hps.updates.deadletter import DeadLetters
from hps.updates.following import ModelFollower
from hps.updates.heartbeat import Heartbeat
from hps.updates.messages import MAX_AHEAD_S as MAX_AHEAD_S
from hps.updates.messages import batches_for, read_message
from hps.updates.messages import decode_message as decode_message
from hps.updates.metrics import PrometheusRecorder, Recorder
from hps.updates.replay import Catchup
from hps.updates.routing import Router

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
LAG_INTERVAL_S = 1.0
DRAIN_CHUNK = 256
MAX_BATCH_BYTES = 64 << 20
MAX_BACKOFF_DOUBLINGS = 30  # 2**30 ms already exceeds the cap; more would overflow a float


def backoff_s(first_ms: int, attempt: int) -> float:
    """The wait before retry ``attempt + 1`` of a failed apply: ``first_ms`` (at least 1 ms)
    doubled ``attempt`` times, at most :data:`MAX_BACKOFF_S`, however long a tier stays
    down."""
    doubled = max(first_ms, 1) / 1000 * 2 ** min(attempt, MAX_BACKOFF_DOUBLINGS)
    return min(doubled, MAX_BACKOFF_S)


class Source(Protocol):
    """What the loop needs of its messages' source (:class:`hps.updates.source.MessageSource`
    is the one HPS runs)."""

    @property
    def topics(self) -> list[str]: ...
    @property
    def commit_failed(self) -> bool: ...
    def poll(self, timeout_s: float) -> Message | None: ...
    def drain(self, max_messages: int) -> list[Message]: ...
    def store(self, msgs: Sequence[Message]) -> None: ...
    def rewind(self, msgs: Sequence[Message]) -> None: ...
    def commit(self, *, asynchronous: bool) -> None: ...
    def lag(
        self, unapplied: Mapping[tuple[str, int], int] | None = None
    ) -> dict[tuple[str, int], int]: ...
    def positions(self) -> dict[tuple[str, int], int]: ...
    def close(self) -> None: ...


class UpdateConsumer:
    """Runs the loop over a :class:`Source` into an :class:`Applier`.

    ``router`` decides which tables of which model versions a message goes to (default:
    the applier's tables, each the live version of its model); ``catchup`` (``hps consume``)
    replays to a version what it missed while it was loading; ``follower`` (``hps consume``)
    keeps the subscription to the node's served models."""

    def __init__(
        self,
        source: Source,
        applier: Applier,
        settings: UpdateSourceConfig,
        *,
        dead_letters: DeadLetters | None = None,
        heartbeat: Heartbeat | None = None,
        recorder: Recorder | None = None,
        serving: bool = False,
        router: Router | None = None,
        catchup: Catchup | None = None,
        follower: ModelFollower | None = None,
    ) -> None:
        self.source = source
        self.recorder = recorder or PrometheusRecorder()
        self.serving = serving  # applied means served here: record each message's freshness
        self.applier = applier
        self.tables = applier.tables
        self.router = router or Router.fixed(self.tables)
        self.catchup = catchup
        self.follower = follower
        self.settings = settings
        self.dead_letters = dead_letters
        # beaten before every poll and every retry: liveness stops when the loop stalls
        self.heartbeat = heartbeat or Heartbeat()
        self.batches = 0
        self.rows_applied = 0
        self.failures = 0
        self._uncommitted = 0
        self._last_lag = 0.0
        self._lag_series: set[tuple[str, int]] = set()  # the lag series this loop exports
        self._decode_s = 0.0  # decode time of the batch being assembled

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; the current batch is finished and committed first."""
        try:
            while not stop.is_set():
                self.run_once(stop)
        finally:
            self._commit_final()

    def close(self) -> None:
        """Leave the group and release the Kafka clients (after :meth:`run`)."""
        self.source.close()
        if self.dead_letters is not None:
            self.dead_letters.close()

    def run_once(self, stop: threading.Event) -> int:
        """Poll, apply and store one batch; returns the number of messages handled."""
        self.heartbeat.beat()
        self._follow_versions(stop)
        first = self.source.poll(self.settings.poll_timeout_ms / 1000)
        if first is None:
            self._idle()
            return 0
        msgs = [first]
        try:
            return self._handle(msgs, stop)
        except BaseException:  # unforeseen: the batch is read again, never skipped
            self._rewind(msgs)
            raise

    def _rewind(self, msgs: list[Message]) -> None:
        try:
            self.source.rewind(msgs)
        except Exception as exc:  # noqa: BLE001 - the original error is the one to raise
            log.error("cannot read %d messages again (%s): they are lost to this consumer",
                      len(msgs), exc)  # fmt: skip

    def _handle(self, msgs: list[Message], stop: threading.Event) -> int:
        """Decode, apply and store the batch that starts with ``msgs[0]`` (``msgs`` grows
        with what is drained, so that a failure can read all of it again)."""
        first = msgs[0]
        started = time.perf_counter()
        self._decode_s = 0.0
        updates: list[UpdateBatch] = []
        bad: list[tuple[Message, str]] = []
        rows = self._decode(first, updates, bad, time.time_ns())
        size = len(first.value() or b"")
        limit = self.settings.max_batch_size
        while rows < limit and len(msgs) < limit and size < MAX_BATCH_BYTES:
            per_msg = max(1, rows // len(msgs))  # drain about as many as still fit
            per_bytes = max(1, size // len(msgs))
            fit = min(DRAIN_CHUNK, (limit - rows) // per_msg, limit - len(msgs),
                      (MAX_BATCH_BYTES - size) // per_bytes)  # fmt: skip
            more = self.source.drain(max(1, fit))
            if not more:
                break
            msgs.extend(more)
            receipt_ns = time.time_ns()
            for m in more:
                rows += self._decode(m, updates, bad, receipt_ns)
                size += len(m.value() or b"")
        self.recorder.stage("batch", time.perf_counter() - started - self._decode_s)
        self.recorder.stage("decode", self._decode_s)
        served = lambda: self._record_applied(updates)  # noqa: E731
        if not self._apply(updates, bad, stop, served=served, inflight=msgs):
            return 0  # stopped while a tier was down: nothing stored, redelivered later
        self.source.store(msgs)
        self.batches += 1
        self._uncommitted += 1
        if self._uncommitted >= self.settings.max_commit_interval:
            self._commit(asynchronous=True)
        self._export_lag()
        return len(msgs)

    def _decode(
        self,
        msg: Message,
        updates: list[UpdateBatch],
        bad: list[tuple[Message, str]],
        receipt_ns: int,
    ) -> int:
        start = time.perf_counter()
        try:
            inc = read_message(
                msg,
                max_version_ahead_s=self.settings.hps_max_version_ahead_s,
                receipt_ns=receipt_ns,
            )
            specs = self.router.route(inc.model, inc.table, inc.tag, inc.ts_ms)
            found, refused = batches_for(inc, [s for s in specs if self.applier.accept(s)])
        except (FormatError, RequestError) as exc:
            bad.append((msg, f"{type(exc).__name__}: {exc}"))
            return 0
        finally:
            self._decode_s += time.perf_counter() - start
        if refused:  # the versions that can take it still do (a replay of it is harmless)
            bad.append((msg, refused))
        if inc.ts_ns > 0:
            self.recorder.age("delivery", inc.ts_ns, receipt_ns)
        updates.extend(upd for upd in found if upd.keys.size)
        return sum(int(upd.keys.size) for upd in found)

    def _follow_versions(self, stop: threading.Event) -> None:
        """Re-read the version record if it changed; replay what a ready version missed."""
        changed = self.router.refresh()
        if self.follower is not None and (changed or self.follower.pending):
            self.follower.follow(new_reading=changed)
        if self.catchup is None:
            return
        if changed:
            self.catchup.observe()
        if self.catchup.due:
            self.catchup.run(self.source.positions, lambda b: self._apply(b, [], stop),
                             self.heartbeat.beat, stop)  # fmt: skip

    def _apply(
        self,
        updates: list[UpdateBatch],
        bad: list[tuple[Message, str]],
        stop: threading.Event,
        served: Callable[[], None] | None = None,
        inflight: Sequence[Message] = (),
    ) -> bool:
        """Apply with retries; ``served()`` runs once, when L2/L3 (and L1) serve the rows,
        before the batch is synced (:meth:`hps.updates.applier.Applier.apply`). While a
        tier fails, the lag goes on being exported, counting ``inflight`` (the batch's
        messages) as not applied."""
        attempt = 0
        pending_dead = list(bad)
        recorded = False

        def served_once() -> None:
            nonlocal recorded
            if served is not None and not recorded:
                recorded = True
                served()

        while True:
            try:
                if pending_dead:
                    self._send_dead(pending_dead)
                    pending_dead = []
                if attempt and self.follower is not None:  # held up: a model removed since?
                    updates = self.follower.drop_removed(updates)
                start = time.perf_counter()
                for applied in self.applier.apply(updates, served=served_once):
                    metrics.APPLIED_ROWS.labels(applied.table, "upsert").inc(applied.keys.size)
                    metrics.APPLIED_ROWS.labels(applied.table, "delete").inc(applied.deleted.size)
                    if applied.stale:
                        metrics.STALE_ROWS.labels(applied.table).inc(applied.stale)
                    self.rows_applied += applied.keys.size + applied.deleted.size
                metrics.observe_batch(self.recorder, time.perf_counter() - start)
                self._retired_meanwhile(updates)
                return True
            except BackendError as exc:
                metrics.FAILURES.inc()
                self.failures += 1
                delay = backoff_s(self.settings.failure_backoff_ms, attempt)
                log.warning(
                    "applying %d updates failed (%s); retrying in %.2fs", len(updates), exc, delay
                )
                attempt += 1
                self.heartbeat.beat()  # waiting out a tier is not a stall
                self._export_lag(inflight)  # it grows meanwhile: the gauge must show it
                if stop.wait(delay):
                    log.warning("stopping with an unapplied batch; it will be redelivered")
                    return False

    def _retired_meanwhile(self, updates: list[UpdateBatch]) -> None:
        """Drop again the tables this batch wrote of versions retired since it was routed:
        on a tier without a writer lock the retire's drop may have run before the batch
        landed, and nothing else would ever drop what it wrote. (Retire records the state
        before it drops: a batch that landed after the drop is seen here.) Costs one
        ``stat`` unless the record changed."""
        watch = self.router.watch
        registry = watch.registry
        if registry is None or not watch.stale():
            return
        by_version: dict[tuple[str, int], set[str]] = {}
        for u in updates:
            model, _, version = TableSpec.parse_name(u.table)
            by_version.setdefault((model, version), set()).add(u.table)
        for (model, version), names in sorted(by_version.items()):
            try:
                retired = registry.get(model, version).state == "retired"
            except (ConfigError, UnknownTableError):  # unreadable or forgotten just now
                continue
            if retired:
                dropped = self.applier.drop(sorted(names))
                log.warning("model %s version %d was retired while a batch for it was in "
                            "flight: dropped again what it wrote (%s)", model, version,
                            ", ".join(dropped))  # fmt: skip

    def _record_applied(self, updates: list[UpdateBatch]) -> None:
        """Per message (not per key): publish timestamp -> L2/L3 hold it (and, in a serving
        process's own applier, L1 too: it serves it), before the batch's sync."""
        now_ns = time.time_ns()
        for upd in updates:
            published = upd.extras.get("published_ns")
            if published is None:
                continue
            self.recorder.age("applied", int(published), now_ns)
            if self.serving:
                self.recorder.fresh(upd.table, int(published), now_ns)

    def _send_dead(self, bad: list[tuple[Message, str]]) -> None:
        for msg, reason in bad:
            metrics.DEAD_LETTERS.labels(reason.split(":", 1)[0]).inc()
            if self.dead_letters is None:
                log.error(
                    "dropping invalid message %s[%d]@%d (no dead-letter topic): %s",
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    reason,
                )
            else:
                self.dead_letters.send(msg, reason)
        if self.dead_letters is not None:
            self.dead_letters.flush()

    def _idle(self) -> None:
        if self._uncommitted or self.source.commit_failed:  # a failed one is sent again
            self._commit(asynchronous=True)
        self._export_lag()

    def _commit(self, *, asynchronous: bool) -> None:
        try:
            self.source.commit(asynchronous=asynchronous)
            self._uncommitted = 0
        except BackendError as exc:  # offsets stay stored; the next commit carries them
            log.warning("commit failed: %s", exc)

    def _commit_final(self) -> None:
        # Synchronous even when the last asynchronous commit covered everything: on return,
        # every stored offset has reached the broker.
        if self.batches:
            self._commit(asynchronous=False)

    def _export_lag(self, inflight: Sequence[Message] = ()) -> None:
        """Messages behind each partition's end, from the first of ``inflight`` (a batch not
        applied yet) where it has one, else from the consumer's position. The series of
        partitions this consumer no longer holds (revoked, lost, their topic left) go."""
        now = time.monotonic()
        if now - self._last_lag < LAG_INTERVAL_S:
            return
        self._last_lag = now
        first: dict[tuple[str, int], int] = {}
        for m in inflight:
            key = (m.topic() or "", m.partition() or 0)
            first[key] = min(first.get(key, m.offset() or 0), m.offset() or 0)
        try:
            lag = self.source.lag(first)
        except BackendError as exc:  # the series stay as they were until the next read
            log.debug("lag unavailable: %s", exc)
            return
        for topic, partition in self._lag_series - lag.keys():
            metrics.CONSUMER_LAG.remove(topic, str(partition))
        for (topic, partition), behind in lag.items():
            metrics.CONSUMER_LAG.labels(topic, str(partition)).set(behind)
        self._lag_series = set(lag)

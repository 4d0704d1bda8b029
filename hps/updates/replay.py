"""The rollout rule: updates published while a version was imported are not lost for it.

While version N of a model is ``loading``, the consumer applies nothing to it (untagged
messages go to the live version and the ready ones above it; N-tagged ones wait). When N
becomes ``ready`` (or live), ``hps consume`` replays each of the model's update topics,
over the partitions it holds, from the offsets of N's import start (its recorded
``created`` less :data:`hps.updates.routing.SKEW_S`, looked up by broker timestamp with
``offsets_for_times``) up to its current position, and applies to N the messages routed to
it (untagged and N-tagged); the per-key update versions make it idempotent. Offsets and
commits are not touched: the replay reads with a consumer of its own, outside the group.

:class:`Rollouts` remembers which versions still owe a replay in a file beside the version
record (one per consumer group), so a consumer stopped while N was loading replays when it
starts again and finds N ready.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hps.errors import BackendError, BackendUnavailable, FormatError, RequestError
from hps.types import TableSpec, UpdateBatch
from hps.updates import codec
from hps.updates.kafka import CONSUMER_DEFAULTS, Setting, merged, translated, with_driver_log
from hps.updates.messages import read_message
from hps.updates.routing import Point, Router

if TYPE_CHECKING:
    from confluent_kafka import Message

    from hps.versions.registry import VersionRegistry

log = logging.getLogger(__name__)

IDLE_LIMIT_S = 30.0  # a replay that receives nothing this long is retried later
Key = tuple[str, int]  # (model, version)


def record_path(registry: VersionRegistry, group_id: str) -> Path | None:
    """Where ``group_id``'s owed replays are kept: beside the version record (None: the
    node keeps no record)."""
    if registry.path is None:
        return None
    digest = hashlib.sha256(group_id.encode()).hexdigest()[:12]
    stem = registry.path.name.removesuffix(".json")
    return registry.path.with_name(f"{stem}.replays-{digest}.json")


class Rollouts:
    """Versions that owe a replay: seen ``loading`` (and recorded in ``path``), or seen
    appearing ready between two readings of the record (a model added at runtime too);
    ``due`` once ready or live. A removed model owes nothing.

    ``recent_s``: at the first reading, the ready and live versions whose import began in
    the last ``recent_s`` owe one too, for a consumer whose ``path`` may be lost (the
    chart's l2-updater keeps it in an emptyDir: moved to another node while a version was
    imported, it would not know that version was ever loading)."""

    def __init__(self, path: Path | None, *, recent_s: float = 0.0) -> None:
        self.path = path
        self.recent_s = recent_s
        self.owed: set[Key] = self._load()
        self.due: set[Key] = set()
        self._seen: dict[str, set[int]] | None = None  # versions at the last reading

    def _load(self) -> set[Key]:
        if self.path is None:
            return set()
        try:
            doc = json.loads(self.path.read_text())
            return {(str(m), int(n)) for m, ns in doc.items() for n in ns}
        except FileNotFoundError:
            return set()
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("%s unreadable (%s): no replay owed from before this start", self.path, exc)
            return set()

    def _save(self) -> None:
        if self.path is None:
            return
        doc: dict[str, list[int]] = {}
        for model, n in sorted(self.owed):
            doc.setdefault(model, []).append(n)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.path)
        except OSError as exc:  # a restart may then miss a replay: say so
            log.warning("cannot record owed replays in %s: %s", self.path, exc)

    def observe(self, points: Mapping[str, Mapping[int, Point]]) -> None:
        """Take a new reading of the record."""
        before = set(self.owed)
        since_ms = (time.time() - self.recent_s) * 1000 if self._seen is None else math.inf
        for model, versions in points.items():
            seen = None if self._seen is None else self._seen.get(model, set())
            for n, p in versions.items():
                key = (model, n)
                if p.state == "loading":
                    self.owed.add(key)
                elif p.state in ("ready", "live") and (
                    key in self.owed
                    or (seen is not None and n not in seen)
                    or (self.recent_s > 0 and p.start_ms > 0 and p.start_ms >= since_ms)
                ):
                    self.owed.add(key)
                    self.due.add(key)
            for key in [k for k in self.owed if k[0] == model]:
                gone = key[1] not in versions or versions[key[1]].state == "retired"
                if gone:  # its import failed, or it was retired: nothing to replay
                    self.owed.discard(key)
                    self.due.discard(key)
        for key in [k for k in self.owed if k[0] not in points]:  # a model removed
            self.owed.discard(key)
            self.due.discard(key)
        self._seen = {m: set(v) for m, v in points.items()}
        if self.owed != before:
            self._save()

    def done(self, key: Key) -> None:
        self.due.discard(key)
        self.owed.discard(key)
        self._save()


class Replayer:
    """Reads offset ranges of update topics with a consumer of its own (no group, no
    commits)."""

    def __init__(
        self, brokers: str, group_id: str, config: Mapping[str, Setting] | None = None
    ) -> None:
        self.conf = merged(brokers, CONSUMER_DEFAULTS, {"group.id": f"{group_id}-replay"}, config)

    def read(
        self, ends: Mapping[tuple[str, int], int], start_ms: int, stop: threading.Event
    ) -> Iterator[list[Message]]:
        """The messages of each partition in ``ends`` from the first stamped at or after
        ``start_ms`` up to (not including) its end offset, in chunks."""
        from confluent_kafka import Consumer, TopicPartition

        with translated("replaying updates"):
            consumer = Consumer(with_driver_log(self.conf))
        try:
            with translated("looking up offsets by time"):
                asked = [TopicPartition(t, p, max(start_ms, 0)) for t, p in ends]
                found = consumer.offsets_for_times(asked, timeout=15.0) if asked else []
            left: dict[tuple[str, int], int] = {}
            parts = []
            for tp in found:
                end = ends[(tp.topic, tp.partition)]
                if 0 <= tp.offset < end:  # -1: nothing stamped since start_ms
                    left[(tp.topic, tp.partition)] = end
                    parts.append(TopicPartition(tp.topic, tp.partition, tp.offset))
            if parts:
                consumer.assign(parts)
            idle_since = time.monotonic()
            while left and not stop.is_set():
                chunk = []
                for m in consumer.consume(500, 0.2):
                    if m.error() is not None:
                        continue
                    key = (m.topic() or "", int(m.partition() or 0))
                    offset, last = int(m.offset() or 0), left.get(key)
                    if last is None or offset >= last:
                        continue
                    chunk.append(m)
                    if offset >= last - 1:
                        del left[key]
                        consumer.pause([TopicPartition(key[0], key[1])])
                if chunk:
                    idle_since = time.monotonic()
                    yield chunk
                elif time.monotonic() - idle_since > IDLE_LIMIT_S:
                    raise BackendUnavailable(
                        f"kafka: replay received nothing for {IDLE_LIMIT_S:g}s "
                        f"({len(left)} partitions unfinished)"
                    )
        finally:
            consumer.close()


class Catchup:
    """Replays owed versions (``rollouts.due``) through ``router`` into the consumer's
    applier (``accept``: whether some tier takes a table's updates)."""

    def __init__(
        self,
        router: Router,
        rollouts: Rollouts,
        replayer: Replayer,
        accept: Callable[[TableSpec], bool],
        *,
        max_rows: int,
        max_version_ahead_s: float,
    ) -> None:
        self.router = router
        self.rollouts = rollouts
        self.replayer = replayer
        self.accept = accept
        self.max_rows = max_rows
        self.ahead_s = max_version_ahead_s
        self.replayed = 0  # messages read again, all replays together
        self.observe()

    @property
    def due(self) -> set[Key]:
        return self.rollouts.due

    def observe(self) -> None:
        """Take the router's current reading of the version record."""
        self.rollouts.observe(self.router.watch.points)

    def run(
        self,
        positions: Callable[[], dict[tuple[str, int], int]],
        apply: Callable[[list[UpdateBatch]], bool],
        beat: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        """Replay every due version up to ``positions()`` (the consumer's next offsets of the
        partitions it holds; none yet: later) with ``apply`` (False: stopped). A broker
        that cannot say them now: again on the next pass."""
        try:
            ends = positions()
        except BackendError as exc:
            log.warning("replays wait: the consumer's positions cannot be read (%s)", exc)
            return
        if not ends:
            return
        for key in sorted(self.due):
            if stop.is_set() or not self._replay(key, ends, apply, beat, stop):
                return  # still owed: on the next pass (or the next start)
            self.rollouts.done(key)

    def _replay(
        self,
        key: Key,
        positions: dict[tuple[str, int], int],
        apply: Callable[[list[UpdateBatch]], bool],
        beat: Callable[[], None],
        stop: threading.Event,
    ) -> bool:
        model, version = key
        topics = {codec.topic_name(s.model, s.table) for s in self.router.version_tables(*key)}
        ends = {tp: end for tp, end in positions.items() if tp[0] in topics}
        read = 0
        try:
            for batch, msgs in replay_batches(
                self.replayer, self.router, key, ends, accept=self.accept,
                max_rows=self.max_rows, max_version_ahead_s=self.ahead_s, stop=stop,
            ):  # fmt: skip
                beat()
                if not apply(batch):
                    return False
                read += msgs
        except BackendError as exc:  # the broker: again on the next pass
            log.warning("model %s version %d: replay failed (%s); retrying", model, version, exc)
            return False
        self.replayed += read
        log.info("model %s version %d: replayed %d messages of %d partitions to it",
                 model, version, read, len(ends))  # fmt: skip
        return not stop.is_set()


def replay_batches(
    replayer: Replayer,
    router: Router,
    key: Key,
    ends: Mapping[tuple[str, int], int],
    *,
    accept: Callable[[TableSpec], bool],
    max_rows: int,
    max_version_ahead_s: float,
    stop: threading.Event,
) -> Iterator[tuple[list[UpdateBatch], int]]:
    """Batches (of about ``max_rows`` rows) of what version ``key[1]`` of model ``key[0]``
    takes from the ranges ``ends``, each with the number of messages it was read from."""
    model, version = key
    start = router.watch.points[model][version].start_ms
    batch: list[UpdateBatch] = []
    rows = read = 0
    for msgs in replayer.read(ends, start, stop):
        for m in msgs:
            read += 1
            try:
                inc = read_message(m, max_version_ahead_s=max_version_ahead_s, count=False)
                specs = router.route(inc.model, inc.table, inc.tag, inc.ts_ms, only=version)
                found = [inc.batch(spec) for spec in specs if accept(spec)]
            except (FormatError, RequestError):  # the loop dead-lettered it (or will)
                continue
            for upd in found:
                if upd.keys.size:
                    batch.append(upd)
                    rows += int(upd.keys.size)
        if rows >= max_rows:
            yield batch, read
            batch, rows, read = [], 0, 0
    if batch or read:
        yield batch, read

"""Where update messages come from: one confluent-kafka consumer in one of three modes.

- ``group``: joins the consumer group, offsets stored only for applied messages and committed
  by the caller (``hps consume``).
- ``replay``: every partition from the beginning, no group, no commits (an in-process L2 that
  starts empty must see every retained update); with ``start_ms``, a topic's partitions from
  the first message stamped at or after its time (a model version imported later: only
  what was published since its import began, :mod:`hps.updates.routing`).
- ``tail``: every partition from the group's committed offset (``group.id``: the
  service's; what ``hps consume`` has not applied yet is read too), from the beginning
  where the group committed nothing (as the group reads it); no commits (L1 freshness
  listeners). It reads the group's committed offsets (``committed``).

``replay`` and ``tail`` look for partitions added to their topics as often as the client
refreshes its metadata, and read them from their beginning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from hps.errors import BackendError, ClientLost, ConfigError
from hps.updates import metrics
from hps.updates.kafka import (
    CONSUMER_DEFAULTS,
    Setting,
    check_config,
    ensure_topics,
    merged,
    translated,
    with_driver_log,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

log = logging.getLogger(__name__)

Mode = Literal["group", "replay", "tail"]
TopicPartitionKey = tuple[str, int]


class MessageSource:
    def __init__(
        self,
        brokers: str,
        topics: Sequence[str],
        *,
        mode: Mode,
        group_id: str,
        config: Mapping[str, Setting] | None = None,
        num_partitions: int = 8,
        start_ms: Mapping[str, int] | None = None,
    ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer

        self.mode = mode
        self.topics = sorted(set(topics))
        self._brokers, self._config, self._partitions = brokers, config, num_partitions
        conf = merged(brokers, CONSUMER_DEFAULTS, {"group.id": group_id}, config)
        check_config(conf, "consumer")
        counts = ensure_topics(brokers, self.topics, num_partitions=num_partitions, config=config)
        self._fixed: list[TopicPartition] = []  # replay and tail: what was assigned
        self._last_error_log = 0.0
        self._partitions_checked = time.monotonic()
        # how often replay and tail look for partitions added since: as the client refreshes
        # its metadata (a group consumer learns of them then too, by a rebalance)
        refresh_ms = int(conf.get("topic.metadata.refresh.interval.ms", 300_000))
        self._partitions_every_s = refresh_ms / 1000 if refresh_ms > 0 else math.inf
        self.commit_failed = False  # the last asynchronous commit's answer (group mode)
        # where reading starts, per held partition nothing was read of yet (the lag's base)
        self._starts: dict[TopicPartitionKey, int] = {}
        self._reset = conf.get("auto.offset.reset", "largest")
        driver: dict[str, object] = {**with_driver_log(conf)}
        if mode == "group":
            driver["on_commit"] = self._on_commit
        with translated(f"consuming {len(self.topics)} topics"):
            self._consumer = Consumer(driver)
            if mode == "group":
                self._consumer.subscribe(
                    self.topics,
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
            else:
                from confluent_kafka import TopicPartition

                parts = [TopicPartition(t, p) for t in self.topics for p in range(counts[t])]
                applied = self._committed_of(parts) if mode == "tail" else {}
                for tp in parts:
                    if mode == "replay":
                        tp.offset = OFFSET_BEGINNING
                        continue
                    # a message the group has not applied yet may still change a row L1
                    # loads from L2/L3 meanwhile: a listener reads from there (from the
                    # beginning where it committed nothing: auto.offset.reset, earliest)
                    done = applied.get((tp.topic, tp.partition))
                    tp.offset = OFFSET_BEGINNING if done is None else min(done, self._end(tp))
                if mode == "replay" and start_ms:
                    self._from_times(parts, start_ms)
                self._fixed = parts
                self._consumer.assign(parts)

    def _from_times(self, parts: list[TopicPartition], start_ms: Mapping[str, int]) -> None:
        """Start the partitions of each topic in ``start_ms`` at its time (in place)."""
        from confluent_kafka import TopicPartition

        asked = [
            TopicPartition(tp.topic, tp.partition, start_ms[tp.topic])
            for tp in parts
            if start_ms.get(tp.topic, 0) > 0
        ]
        if not asked:
            return
        found = {
            (tp.topic, tp.partition): tp.offset
            for tp in self._consumer.offsets_for_times(asked, timeout=15.0)
        }
        for tp in parts:
            offset = found.get((tp.topic, tp.partition))
            if offset is not None:  # -1: nothing stamped since: the end
                tp.offset = offset if offset >= 0 else self._end(tp)

    def _committed_of(self, parts: list[TopicPartition]) -> dict[TopicPartitionKey, int]:
        from confluent_kafka import TopicPartition

        asked = [TopicPartition(tp.topic, tp.partition) for tp in parts]
        got = self._consumer.committed(asked, timeout=10.0) if asked else []
        return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}

    def _end(self, tp: TopicPartition) -> int:
        # An explicit offset rather than OFFSET_END: the source is positioned on return, so
        # nothing published after the constructor returns is missed.
        _, high = self._consumer.get_watermark_offsets(tp, timeout=10.0)
        return int(high)

    def subscribe(self, topics: Sequence[str]) -> None:
        """Group mode: consume ``topics`` from now on instead (``hps consume`` following the
        node's models). The stored offsets are committed first; the group rebalances at the
        next poll, and a topic the group never committed is read from its beginning."""
        if self.mode != "group":
            raise ConfigError(f"a {self.mode} source reads a fixed set of topics")
        wanted = sorted(set(topics))
        ensure_topics(self._brokers, wanted, num_partitions=self._partitions, config=self._config)
        self.commit(asynchronous=False)
        with translated(f"subscribing to {len(wanted)} topics"):
            if wanted:
                self._consumer.subscribe(
                    wanted,
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
            else:
                self._consumer.unsubscribe()
        self.topics = wanted

    # -- rebalance callbacks (group mode; run inside poll) ----------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", _describe(partitions))
        for tp in partitions:  # a committed offset read before may have moved since
            self._starts.pop((tp.topic, tp.partition), None)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Every message handed out before this poll is applied and stored: commit it now.
        log.info("revoked %s", _describe(partitions))
        self._released(partitions)
        try:
            self.commit(asynchronous=False)
        except BackendError as exc:
            log.warning("offsets not committed at a rebalance (%s); their new owner reads "
                        "them again", exc)  # fmt: skip

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group moved on without us (a poll came too late): a commit would fail.
        log.warning("lost %s to the group: offsets stored since the last commit are read "
                    "again by their new owner", _describe(partitions))  # fmt: skip
        self._released(partitions)

    def _released(self, partitions: list[TopicPartition]) -> None:
        """Forget what is known of ``partitions`` (revoked or lost): their lag series go
        (their new owner exports them) and so do their starts."""
        for tp in partitions:
            self._starts.pop((tp.topic, tp.partition), None)
            metrics.CONSUMER_LAG.remove(tp.topic, str(tp.partition))

    def _held(self) -> list[TopicPartition]:
        """The partitions this source reads now: the group's assignment as the driver holds
        it (an incremental rebalance hands callbacks only the change), else the fixed set."""
        if self.mode != "group":
            return self._fixed
        with translated("reading the assignment"):
            return list(self._consumer.assignment())

    # -- messages ---------------------------------------------------------------------------

    def poll(self, timeout_s: float) -> Message | None:
        """The next message (None on timeout); transient errors are logged and skipped."""
        if self.mode != "group":
            self._assign_new_partitions()
        msg = self._consumer.poll(timeout_s)
        if msg is None or self._is_error(msg):
            return None
        return msg

    def _assign_new_partitions(self) -> None:
        """Every ``topic.metadata.refresh.interval.ms`` (``metadata_refresh_interval_ms``):
        read partitions added to the topics since the last look, from their beginning (all
        they hold was published after they were added). A failed metadata read waits for
        the next look."""
        now = time.monotonic()
        if now - self._partitions_checked < self._partitions_every_s:
            return
        self._partitions_checked = now
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        try:
            with translated("reading the topics' partitions"):
                found = self._consumer.list_topics(timeout=5.0).topics
        except BackendError as exc:
            log.debug("partitions not checked: %s", exc)
            return
        held = {(tp.topic, tp.partition) for tp in self._fixed}
        new = [
            TopicPartition(t, p, OFFSET_BEGINNING)
            for t in self.topics
            if t in found
            for p in sorted(found[t].partitions)
            if (t, p) not in held
        ]
        if not new:
            return
        with translated("assigning new partitions"):
            self._consumer.incremental_assign(new)
        self._fixed = [*self._fixed, *new]
        log.info("partitions added since the start: %s; reading them from their beginning",
                 _describe(new))  # fmt: skip

    def drain(self, max_messages: int) -> list[Message]:
        """Messages already fetched, without waiting."""
        if max_messages <= 0:
            return []
        return [m for m in self._consumer.consume(max_messages, 0) if not self._is_error(m)]

    def _is_error(self, msg: Message) -> bool:
        err = msg.error()
        if err is None:
            return False
        if err.fatal():
            raise ClientLost(f"kafka: fatal consumer error: {err.name()}: {err.str()}")
        now = time.monotonic()
        if now - self._last_error_log > 10:
            self._last_error_log = now
            log.warning("kafka: %s: %s", err.name(), err.str())
        return True

    # -- offsets ----------------------------------------------------------------------------

    def store(self, msgs: Sequence[Message]) -> None:
        """Mark ``msgs`` as applied (group mode): their next offsets are committed later."""
        if self.mode != "group" or not msgs:
            return
        from confluent_kafka import TopicPartition

        nxt: dict[TopicPartitionKey, int] = {}
        for m in msgs:
            topic, partition, offset = position(m)
            key = (topic, partition)
            nxt[key] = max(nxt.get(key, -1), offset + 1)
        try:
            with translated("storing offsets"):
                self._consumer.store_offsets(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in nxt.items()]
                )
        except BackendError as exc:  # a partition revoked meanwhile: its new owner replays
            log.info("offsets not stored (%s); the new owner re-applies them", exc)

    def rewind(self, msgs: Sequence[Message]) -> None:
        """Read ``msgs`` again: each of their partitions goes back to its first offset
        among them (messages taken but not applied are not lost to this consumer)."""
        from confluent_kafka import TopicPartition

        first: dict[TopicPartitionKey, int] = {}
        for m in msgs:
            topic, partition, offset = position(m)
            key = (topic, partition)
            first[key] = min(first.get(key, offset), offset)
        with translated("rewinding"):
            for (topic, partition), offset in first.items():
                self._consumer.seek(TopicPartition(topic, partition, offset))

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker's answer to a commit (run inside poll): a failed asynchronous commit
        is sent again by the loop's next idle poll (:attr:`commit_failed`)."""
        failed = err is not None and err.name() != "_NO_OFFSET"
        if failed and not self.commit_failed:
            log.warning("commit failed: %s; sent again at the next idle poll", err)
        self.commit_failed = failed

    def commit(self, *, asynchronous: bool) -> None:
        if self.mode != "group":
            return
        with translated("commit", ignore={"_NO_OFFSET"}):  # _NO_OFFSET: nothing new
            if asynchronous:
                self._consumer.commit(asynchronous=True)
            else:
                self._consumer.commit(asynchronous=False)

    def committed(self, timeout_s: float = 5.0) -> dict[TopicPartitionKey, int]:
        """The group's committed next offsets of the partitions this source reads."""
        from confluent_kafka import TopicPartition

        parts = [TopicPartition(tp.topic, tp.partition) for tp in self._held()]
        if not parts:
            return {}
        with translated("reading committed offsets"):
            got = self._consumer.committed(parts, timeout=timeout_s)
        return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}

    def lag(
        self, unapplied: Mapping[TopicPartitionKey, int] | None = None
    ) -> dict[TopicPartitionKey, int]:
        """Messages behind the high watermark (cached) of each partition this source holds,
        from its position, or from ``unapplied``'s offset where it gives one below it (a
        batch read but not applied yet). A partition nothing was read of yet (no position)
        counts from where reading it starts (:meth:`_start`). A partition whose high
        watermark is not known yet is left out. Raises BackendError when the client cannot
        say."""
        held = self._held()
        if not held:
            return {}
        out: dict[TopicPartitionKey, int] = {}
        with translated("reading the lag"):
            positions = self._consumer.position(held)
            starts = self._start([tp for tp in positions if tp.offset < 0])
            for tp in positions:
                key = (tp.topic, tp.partition)
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
                at = tp.offset if tp.offset >= 0 else starts.get(key, -1)
                if unapplied and key in unapplied:
                    at = unapplied[key] if at < 0 else min(at, unapplied[key])
                if high >= 0 and at >= 0:
                    out[key] = max(0, high - at)
        return out

    def _start(self, unread: list[TopicPartition]) -> dict[TopicPartitionKey, int]:
        """Where reading each of ``unread`` (held, nothing read yet) starts: the group's
        committed offset (group and tail modes), else the offset it was assigned at, else
        its low watermark. Asked of the broker once per partition and assignment."""
        from confluent_kafka import TopicPartition

        missing = [tp for tp in unread if (tp.topic, tp.partition) not in self._starts]
        if missing:
            found = self._committed_of(missing) if self.mode != "replay" else {}
            fixed = {(tp.topic, tp.partition): tp.offset for tp in self._fixed}
            for tp in missing:
                key = (tp.topic, tp.partition)
                at = found.get(key, fixed.get(key, -1))
                if at < 0:  # from the beginning (or the end, for lack of anything better)
                    low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition), timeout=5.0
                    )
                    reset = str(self._reset)
                    at = int(high) if reset in ("latest", "largest", "end") else int(low)
                self._starts[key] = at
        return {(tp.topic, tp.partition): self._starts[(tp.topic, tp.partition)] for tp in unread}

    def positions(self) -> dict[TopicPartitionKey, int]:
        """The next offset this consumer reads of each partition it holds (the group's
        committed one where it has read nothing yet; left out where neither exists)."""
        held = self._held()
        if not held:
            return {}
        from confluent_kafka import TopicPartition

        with translated("reading positions"):
            got = self._consumer.position([TopicPartition(tp.topic, tp.partition) for tp in held])
        out = {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}
        if len(out) < len(got) and self.mode == "group":
            for key, offset in self.committed().items():
                out.setdefault(key, offset)
        return out

    @property
    def assignment(self) -> list[TopicPartitionKey]:
        return [(tp.topic, tp.partition) for tp in self._held()]

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already closed
            self._consumer.close()


def position(msg: Message) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a consumed message (only error events lack them,
    and :meth:`MessageSource.poll` and :meth:`~MessageSource.drain` never hand those out)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None, msg.error()
    return topic, partition, offset


def _describe(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"

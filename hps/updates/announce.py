"""One update stream per node: ``hps consume`` tells the node's serving processes what it
applied, through the node's change journal (``update_source.hps_l1_refresh: journal``;
docs/updates.md, "One update stream per node").

With a listener per serving process (``listener``, the default) every process of the node
fetches every update topic itself; on a broker that answers each waiting fetch with work
per partition, that is what the node's readers lose to updates. Here the consumer that
writes the node's L2 and L3 appends one journal entry per applied batch, after every tier
holds it: each table's upserted keys with their stored rows, its deleted keys, and the
publish timestamps of its messages. Each serving process's journal follower
(:class:`hps.updates.journal_follower.JournalFollower`) refreshes its resident L1 rows from
the entry and records the updates' freshness; nothing in it reads Kafka.

Only sound when this consumer writes every tier the serving processes read: the node's
shared L2 (or none) and its L3. A deployment with a separate L2 updater (the Helm chart's
Redis layout) keeps the listeners.
"""

from __future__ import annotations

from collections.abc import Sequence

from hps.errors import BackendError
from hps.updates.applier import Applied
from hps.updates.journal import Change, Journal


class JournalAnnouncer:
    """An :data:`hps.updates.applier.Listener` that journals each applied batch."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.entries = 0

    def __call__(self, batch: Sequence[Applied]) -> None:
        changes = []
        for a in batch:
            # the upsert part carries the batch's timestamps; so does a part whose rows were
            # all stale (nothing changes, but its updates are served as they were)
            upsert = bool(a.keys.size) or (not a.deleted.size and bool(a.published_ns))
            if upsert:
                changes.append(Change("upsert", a.table, a.keys, a.values, a.published_ns, True))
            if a.deleted.size:
                published = () if upsert else a.published_ns  # each update counted once
                changes.append(Change("delete", a.table, a.deleted, None, published, True))
        if not changes:
            return
        try:
            self.journal.append_changes(changes)
        except OSError as exc:
            raise BackendError(f"change journal {self.journal.folder}: {exc}") from None
        self.entries += 1

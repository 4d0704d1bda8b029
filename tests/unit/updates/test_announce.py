"""hps consume's side of one update stream per node: each applied batch becomes one entry
of the node's change journal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.errors import BackendError
from hps.updates.announce import JournalAnnouncer
from hps.updates.applier import Applied
from hps.updates.journal import Journal

ROWS = np.arange(6, dtype=np.float32).reshape(3, 2)
NONE = np.empty(0, np.int64)


def _applied(
    table: str, keys: list[int], deleted: list[int], published: tuple[int, ...]
) -> Applied:
    k = np.array(keys, np.int64)
    return Applied(table, k, ROWS[: k.size], np.array(deleted, np.int64), 0, published)


def test_one_entry_per_batch_with_every_table(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    announce = JournalAnnouncer(journal)
    announce(
        [
            _applied("m.a", [1, 2], [9], (10, 11)),
            _applied("m.b", [], [4], (12,)),
            _applied("m.c", [], [], (13,)),  # every row stale: served as it was
            _applied("m.d", [], [], ()),  # nothing at all: no change
        ]
    )
    _, head = journal.head()
    entry = journal.read(head)
    assert entry is not None and announce.entries == 1
    got = [(c.kind, c.table, c.keys.tolist(), c.published_ns) for c in entry.changes]  # type: ignore[union-attr]
    assert got == [
        ("upsert", "m.a", [1, 2], (10, 11)),
        ("delete", "m.a", [9], ()),  # its updates counted once, with the upsert
        ("delete", "m.b", [4], (12,)),
        ("upsert", "m.c", [], (13,)),
    ]
    assert all(c.from_updates for c in entry.changes)
    np.testing.assert_array_equal(entry.changes[0].rows, ROWS[:2])
    announce([_applied("m.d", [], [], ())])
    assert journal.head()[1] == head  # an empty batch appends nothing


def test_a_journal_that_cannot_be_written_fails_the_batch(tmp_path: Path) -> None:
    """The consumer applies the batch again (idempotent) rather than leave L1s stale."""
    (tmp_path / "j").write_text("not a folder")
    announce = JournalAnnouncer(Journal(tmp_path / "j"))
    with pytest.raises(BackendError, match="change journal"):
        announce([_applied("m.a", [1], [], (10,))])

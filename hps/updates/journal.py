"""A node's change journal, the folder and its writer side: how control-plane writes reach
every serving instance without a reload (docs/control-plane.md, "How writes reach the
serving processes").

Triton routes one request to one instance, so an inference call cannot broadcast; and a
reload replaces every instance (and leaks tritonserver memory). Instead, the control plane
writes L2/L3 and then appends an entry here: which keys of which table changed (``upsert``,
``delete``) or should be loaded into L1 (``warmup``). Every serving process of the node
tails the journal every :data:`POLL_S` and applies the entries as a Kafka update would
(:class:`hps.updates.journal_follower.JournalFollower`).

Layout, in a folder beside the node's state (:func:`journal_dir`: ``<state>.hps-journal``,
the import lock's neighbour):

- ``head.json``: ``{"generation": <random id>, "seq": <last entry>}``, rewritten atomically;
- ``<seq>.json`` (the entry: its changes, each a kind, a table and a key count) and
  ``<seq>.npz`` (each change's keys, ``keys<i>``; absent for a change that stands for every
  key of the table: an import too large to list, :data:`MAX_ENTRY_KEYS`);
- ``readers/<id>.json``: each follower's cursor (generation, last applied seq, model),
  heartbeat and ``problem`` (why the process cannot serve right now, e.g. its shared L2
  being refilled: :meth:`hps.updates.journal_follower.JournalFollower.report`; ``null``
  when none), rewritten at least every :data:`HEARTBEAT_S` and at once when the problem
  changes. The control plane's ``/readyz`` reads them (:mod:`hps.service.health`, check
  ``instances``).

``hps consume`` also appends here when ``update_source.hps_l1_refresh`` is ``journal``
(:mod:`hps.updates.announce`): one entry per applied batch, a change per table, each with
the rows it wrote (``rows<i>``, in the table's stored form) and the publish timestamps of
its messages, so the serving processes refresh their L1 from the entry itself, without a
Kafka consumer of their own (docs/updates.md, "One update stream per node").

Appends hold ``lock`` (flock). Bounded: an append removes the entries every live follower
has applied, then the oldest beyond :data:`MAX_ENTRIES` / :data:`MAX_BYTES` whether read or
not. A follower that finds an entry it needs gone (it fell behind), or a new generation (the
folder was recreated), cannot know what changed: it drops its whole L1 (and refills an L2 of
its own from L3) rather than miss a change.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from hps.errors import FormatError, HPSError
from hps.rowformat import Stored
from hps.types import Keys

log = logging.getLogger(__name__)

Kind = Literal["upsert", "delete", "warmup"]
KINDS: tuple[Kind, ...] = ("upsert", "delete", "warmup")

POLL_S = 0.1  # how often a follower looks at head.json
HEARTBEAT_S = 1.0  # a follower rewrites its cursor at least this often
LIVE_S = 5.0  # a cursor older than this is a follower gone: nobody waits for it
KEEP_S = 600.0  # ... and older than this it holds no entry back from removal
WARN_S = 60.0  # at most one "removed unread" warning per journal writer this often
MAX_ENTRIES = 256
MAX_BYTES = 256 << 20
MAX_ENTRY_KEYS = 1 << 22  # larger imports are journalled as "every key of the table"
_ENTRY = re.compile(r"^(\d{12})\.json$")
_SUFFIXES = (".json", ".npz")


def journal_dir(state: Path) -> Path:
    """The journal of the node whose state is ``state`` (L3's folder, or the ps.json's stem)."""
    return state.with_name(state.name + ".hps-journal")


@dataclass(frozen=True)
class Change:
    """What one entry says about one table."""

    kind: Kind
    table: str  # <model>.<table>
    keys: Keys | None  # None: every key of the table
    rows: Stored | None = None  # the upserted rows as stored (hps consume's), else re-read
    published_ns: tuple[int, ...] = ()  # publish timestamps of the updates it carries
    from_updates: bool = False  # hps consume's: L2/L3 held it when it was appended


@dataclass(frozen=True)
class Entry:
    seq: int
    changes: tuple[Change, ...]
    time_ns: int  # when it was appended (L2/L3 held its changes by then)


@dataclass(frozen=True)
class Cursor:
    """One follower as its cursor file says."""

    id: str
    model: str
    generation: str
    seq: int
    age_s: float
    problem: str | None = None  # why the process cannot serve right now (None: it can)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class Journal:
    """One node's journal folder (created on first use)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.readers_dir = folder / "readers"
        self._unread = 0  # entries removed unread since the last warning
        self._warned = -WARN_S

    # -- both sides ------------------------------------------------------------------------

    def head(self) -> tuple[str, int]:
        """(generation, last seq); creates the journal when there is none."""
        try:
            doc = json.loads((self.folder / "head.json").read_bytes())
            return str(doc["generation"]), int(doc["seq"])
        except FileNotFoundError:
            with self._locked():
                return self._head_locked()
        except (ValueError, KeyError) as exc:  # written atomically: only a foreign file
            raise HPSError(f"{self.folder}/head.json: not a journal head: {exc}") from None

    def head_stamp(self) -> tuple[int, int] | None:
        """head.json's inode and modification time (None: no head yet): changes with it."""
        try:
            st = os.stat(self.folder / "head.json")
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _head_locked(self) -> tuple[str, int]:
        path = self.folder / "head.json"
        if not path.exists():
            self._set_head(uuid.uuid4().hex, 0)
        doc = json.loads(path.read_bytes())
        return str(doc["generation"]), int(doc["seq"])

    def _set_head(self, generation: str, seq: int) -> None:
        doc = {"generation": generation, "seq": seq}
        _write_atomic(self.folder / "head.json", json.dumps(doc).encode())

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.readers_dir.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _name(self, seq: int, suffix: str) -> Path:
        return self.folder / f"{seq:012d}{suffix}"

    # -- the control plane -----------------------------------------------------------------

    def append(self, kind: Kind, table: str, keys: Keys | None) -> int:
        """Record that ``keys`` of ``table`` changed (or are to be warmed up); its seq."""
        return self.append_changes([Change(kind, table, keys)])

    def append_changes(self, changes: Sequence[Change]) -> int:
        """Record ``changes`` as one entry (followers apply them together); its seq."""
        arrays: dict[str, np.ndarray] = {}
        parts = []
        for i, c in enumerate(changes):
            if c.keys is not None:
                arrays[f"keys{i}"] = np.ascontiguousarray(c.keys, dtype=np.int64)
            if c.rows is not None:
                arrays[f"rows{i}"] = np.ascontiguousarray(c.rows)
            parts.append(
                {
                    "kind": c.kind,
                    "table": c.table,
                    "keys": None if c.keys is None else int(c.keys.size),
                    "published_ns": list(c.published_ns),
                    "from_updates": c.from_updates,
                }
            )
        with self._locked():
            generation, seq = self._head_locked()
            seq += 1
            if arrays:
                with open(self._name(seq, ".npz"), "wb") as fh:
                    np.savez(fh, allow_pickle=False, **arrays)
            meta = {"seq": seq, "time_ns": time.time_ns(), "changes": parts}
            _write_atomic(self._name(seq, ".json"), json.dumps(meta).encode())
            self._set_head(generation, seq)
            self._trim(generation, seq)
        return seq

    def _trim(self, generation: str, head: int) -> None:
        """Remove what every live follower applied, then the oldest beyond the bounds."""
        held = [c.seq for c in self.cursors() if c.generation == generation and c.age_s < KEEP_S]
        applied = min(held, default=head - 1)  # none: the previous ones (a new one starts at head)
        seqs = self.seqs()
        sizes = {s: self._size(s) for s in seqs}
        total = sum(sizes.values())
        for i, s in enumerate(seqs):
            over = len(seqs) - i > MAX_ENTRIES or total > MAX_BYTES
            if s == head or (s > applied and not over):
                break
            if s > applied:
                self._removed_unread(s)
            total -= sizes[s]
            for suffix in _SUFFIXES:
                self._name(s, suffix).unlink(missing_ok=True)

    def _removed_unread(self, seq: int) -> None:
        """Warn of entries removed before a follower read them, at most every WARN_S (a
        follower gone without removing its cursor holds every entry back until KEEP_S)."""
        self._unread += 1
        now = time.monotonic()
        if now - self._warned >= WARN_S:
            log.warning(
                "change journal over its bounds: %d entries removed unread (latest %d); a "
                "follower that needed them drops its L1",
                self._unread,
                seq,
            )
            self._unread, self._warned = 0, now

    def _size(self, seq: int) -> int:
        total = 0
        for suffix in _SUFFIXES:
            with suppress(FileNotFoundError):
                total += self._name(seq, suffix).stat().st_size
        return total

    def seqs(self) -> list[int]:
        """The entries present, oldest first."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _ENTRY.match(n)))

    def cursors(self) -> list[Cursor]:
        out = []
        now = time.time()
        try:
            names = os.listdir(self.readers_dir)
        except FileNotFoundError:
            return []
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                doc = json.loads((self.readers_dir / name).read_bytes())
                out.append(
                    Cursor(
                        name[:-5],
                        str(doc["model"]),
                        str(doc["generation"]),
                        int(doc["seq"]),
                        now - float(doc["time"]),
                        None if doc.get("problem") is None else str(doc["problem"]),
                    )
                )
            except (OSError, ValueError, KeyError):
                continue  # removed meanwhile, or not ours
        return out

    def wait_applied(self, model: str, seq: int, timeout_s: float) -> tuple[int, int]:
        """Wait until every live follower of ``model`` has applied entry ``seq`` (at most
        ``timeout_s``); (followers that have, live followers)."""
        generation, _ = self.head()
        deadline = time.monotonic() + timeout_s
        while True:
            live = [
                c
                for c in self.cursors()
                if c.model == model and c.age_s < LIVE_S and c.generation == generation
            ]
            done = sum(c.seq >= seq for c in live)
            if done == len(live) or time.monotonic() >= deadline:
                return done, len(live)
            time.sleep(POLL_S / 4)

    # -- the serving processes -------------------------------------------------------------

    def read(self, seq: int) -> Entry | None:
        """Entry ``seq``, or None when it is gone (removed: the reader fell behind);
        FormatError when it cannot be read as one (e.g. written by another HPS release)."""
        path = self._name(seq, ".json")
        try:
            meta = json.loads(path.read_bytes())
            arrays: dict[str, np.ndarray] = {}
            if any(p["keys"] is not None for p in meta["changes"]):
                with np.load(self._name(seq, ".npz")) as npz:
                    arrays = {name: npz[name] for name in npz.files}
            changes = []
            for i, part in enumerate(meta["changes"]):
                kind = part["kind"]
                if kind not in KINDS:
                    raise FormatError(f"{path}: unknown kind {kind!r}")
                changes.append(
                    Change(
                        kind,
                        str(part["table"]),
                        arrays.get(f"keys{i}"),
                        arrays.get(f"rows{i}"),
                        tuple(int(t) for t in part["published_ns"]),
                        bool(part["from_updates"]),
                    )
                )
            return Entry(seq, tuple(changes), int(meta["time_ns"]))
        except FileNotFoundError:
            return None
        except (KeyError, TypeError, ValueError, OSError) as exc:  # JSON, npz, fields
            raise FormatError(f"{path}: not a journal entry: {type(exc).__name__}: {exc}") from None

    def write_cursor(
        self, reader: str, model: str, generation: str, seq: int, problem: str | None = None
    ) -> None:
        doc = {
            "model": model,
            "generation": generation,
            "seq": seq,
            "time": time.time(),
            "problem": problem,
        }
        self.readers_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.readers_dir / f"{reader}.json", json.dumps(doc).encode())

    def remove_cursor(self, reader: str) -> None:
        (self.readers_dir / f"{reader}.json").unlink(missing_ok=True)

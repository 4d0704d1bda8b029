"""What the other nodes' published records say (hps.versions.node_record): which of them
hold a version, so that its rows in a shared L2 are kept for them."""

from __future__ import annotations

import json

from hps.versions import VersionInfo, VersionState
from hps.versions.node_record import (
    IMPORTED,
    STALE_S,
    ModelRecord,
    NodeRecord,
    fingerprints,
    holders,
)

ENTRY = {"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4]}
NOW = 1_000_000.0


def published(at: float, *states: VersionState, removed: bool = False) -> bytes:
    """A record of model m published at ``at``: version i+1 in ``states[i]``."""
    versions = {n: VersionInfo(n, s, 1.0, ENTRY) for n, s in enumerate(states, 1)}
    return NodeRecord(at, {"m": ModelRecord(versions, removed, False)}).encode().encode()


def test_a_node_holds_a_version_it_imports_serves_or_keeps() -> None:
    raw = {
        b"importing": published(NOW, "live", "loading"),
        b"ready": published(NOW, "live", "ready"),
        b"live": published(NOW, "ready", "live"),
        b"retired": published(NOW, "live", "retired"),
        b"never heard of it": published(NOW, "live"),
    }
    assert holders(raw, "m", 2, besides="", now=NOW) == ["importing", "live", "ready"]
    assert holders(raw, "other model", 1, besides="", now=NOW) == []


def test_this_node_a_removed_model_a_stale_or_damaged_record_hold_nothing() -> None:
    raw = {
        b"me": published(NOW, "live", "live"),
        b"removed": published(NOW, "live", "ready", removed=True),
        b"gone": published(NOW - STALE_S - 1, "live", "ready"),
        b"damaged": b"{not json",
        b"recent": published(NOW - STALE_S + 1, "live", "ready"),
    }
    assert holders(raw, "m", 2, besides="me", now=NOW) == ["recent"]


def test_a_record_of_another_release_still_says_what_it_holds() -> None:
    """Entries this release would refuse (a key it does not know) do not hide what the
    record holds; a record that is no record at all is left out."""
    doc = json.loads(published(NOW, "live", "ready"))
    for v in doc["models"]["m"]["versions"]:
        v["entry"]["hps_a_later_option"] = True
        v["a_later_field"] = 1
    raw = {b"newer": json.dumps(doc).encode(), b"junk": b"[1, 2]"}
    assert holders(raw, "m", 2, besides="", now=NOW) == ["newer"]
    assert holders(raw, "m", 2, besides="", now=NOW, states=IMPORTED) == ["newer"]
    assert holders(raw, "m", 1, besides="", now=NOW, states=frozenset({"loading"})) == []


def test_a_record_says_which_files_a_node_imported_a_version_from() -> None:
    """The fingerprint published with each version; a record of an older release has none
    (unknown), and still parses."""
    versions = {
        1: VersionInfo(1, "live", 1.0, ENTRY),
        2: VersionInfo(2, "ready", 1.0, ENTRY, fingerprint="blake2b:ab"),
    }
    record = NodeRecord(NOW, {"m": ModelRecord(versions, False, False)}).encode()
    assert NodeRecord.decode(record).models["m"].versions[2].fingerprint == "blake2b:ab"
    older = json.loads(record)
    for v in older["models"]["m"]["versions"]:
        del v["fingerprint"]
    assert NodeRecord.decode(json.dumps(older)).models["m"].versions[2].fingerprint is None
    raw = {b"new": record.encode(), b"old": json.dumps(older).encode()}
    got = fingerprints(raw, "m", 2, besides="", now=NOW, states=IMPORTED)
    assert got == {"new": "blake2b:ab", "old": None}

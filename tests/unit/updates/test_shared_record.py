"""Merging the nodes' version records for the consumer of a shared L2: the shared L2's
version N takes what N takes in some node's L3 (hps.updates.shared_record)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.config import parse_config
from hps.errors import ConfigError, UnknownTableError
from hps.updates.routing import Point, start_ms, targets
from hps.updates.shared_record import RecordFollower, _Every, follow, merge
from hps.versions import VersionInfo, VersionRegistry, VersionState
from hps.versions.node_record import ModelRecord, NodeRecord, node_record

ENTRY = {"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4]}


def node(*states: VersionState, created: float = 100.0, **flags: bool) -> NodeRecord:
    """One node's record of model m: version i+1 in ``states[i]`` (None: absent)."""
    versions = {
        n: VersionInfo(n, s, created + n, ENTRY) for n, s in enumerate(states, 1) if s is not None
    }
    return NodeRecord(1.0, {"m": ModelRecord(versions, flags.get("removed", False),
                                             flags.get("runtime", False))})  # fmt: skip


def merged_states(*nodes: NodeRecord) -> dict[int, str]:
    doc = merge(nodes)["m"]
    assert isinstance(doc, dict) and isinstance(doc["versions"], dict)
    return {int(n): v["state"] for n, v in doc["versions"].items()}


def test_mid_rollout_both_live_versions_take_untagged_updates() -> None:
    rolled = node("ready", "live")  # version 2 live, 1 kept
    not_yet = node("live", "ready")  # version 2 imported, not activated
    assert merged_states(rolled, not_yet) == {1: "live", 2: "live"}


def test_a_version_ready_above_one_nodes_live_takes_untagged_updates() -> None:
    ahead = node("ready", "ready", "live")  # 2 kept below live 3: no untagged updates here
    behind = node("live", "ready", "ready")  # 2 and 3 ready above live 1: they take them
    assert merged_states(ahead, behind) == {1: "live", 2: "live", 3: "live"}


def test_a_kept_rollback_target_takes_tagged_updates_only() -> None:
    assert merged_states(node("ready", "live"), node("ready", "live")) == {1: "ready", 2: "live"}


def test_a_version_takes_the_most_advanced_state_a_node_gives_it() -> None:
    assert merged_states(node("live", "loading"), node("live")) == {1: "live", 2: "loading"}
    assert merged_states(node("live", "loading"), node("ready", "live")) == {1: "live", 2: "live"}
    assert merged_states(node("live", "retired"), node("ready", "ready", "live")) == {
        1: "live", 2: "ready", 3: "live"
    }  # fmt: skip
    assert merged_states(node("retired", "live"), node("retired", "live")) == {
        1: "retired", 2: "live"
    }  # fmt: skip


def test_a_version_starts_at_the_earliest_import_of_the_nodes_that_keep_it() -> None:
    early, late, gone = (
        node("live", "ready", created=50),
        node("live", "loading"),
        node("live", "retired", created=10),
    )
    doc = merge([late, early, gone])["m"]
    assert isinstance(doc, dict) and isinstance(doc["versions"], dict)
    assert doc["versions"]["2"]["created"] == 52.0


def test_a_model_is_removed_when_every_node_naming_it_removed_it() -> None:
    gone = node("live", "ready", removed=True)
    doc = merge([gone, node(None, "live", runtime=True)])["m"]
    assert isinstance(doc, dict) and isinstance(doc["versions"], dict)
    assert (doc["removed"], doc["runtime"]) == (False, True)
    assert set(doc["versions"]) == {"2"}  # the removing node's versions count for nothing
    assert merge([gone, gone])["m"]["removed"] is True  # type: ignore[index]


def test_a_record_survives_its_encoding_and_a_damaged_one_is_refused() -> None:
    record = node("ready", "live", runtime=True)
    assert NodeRecord.decode(record.encode()) == record
    newer = record.encode().replace('"model": "m"', '"model": "m", "hps_from_the_future": 1')
    bad_records = [
        b"", b"{}", b'{"at": 1, "models": {"m": {"versions": [{"version": 1}]}}}', b"[1]",
        record.encode().replace('"live"', '"dead"'),  # a state this release does not know
        record.encode().replace('"created": 101.0', '"created": NaN'),
        record.encode().replace('"created": 101.0', '"created": Infinity'),
        record.encode().replace('"version": 1', '"version": 0'),
        record.encode().replace('"at": 1.0', '"at": NaN'),
        newer,  # an entry of a later release, with a field this one cannot read
    ]  # fmt: skip
    for bad in bad_records:
        with pytest.raises(ValueError, match="not a version record"):
            NodeRecord.decode(bad)


STATES = st.sampled_from(["loading", "ready", "retired", None])


@st.composite
def node_records(draw: st.DrawFn) -> NodeRecord:
    """A node with versions 1-5, exactly one of them live."""
    states: list[VersionState | None] = [draw(STATES) for _ in range(5)]
    states[draw(st.integers(0, 4))] = "live"
    return node(*states, created=draw(st.floats(0, 1000)))


def points(record: NodeRecord) -> dict[int, Point]:
    return {n: Point(v.state, start_ms(v.created)) for n, v in record.models["m"].versions.items()}


def routed(versions: dict[int, Point], tag: int | None) -> set[int] | str:
    try:
        return set(targets("m", versions, tag, 0))
    except UnknownTableError:
        return "dead letter"


@settings(max_examples=300, deadline=None)
@given(st.lists(node_records(), min_size=1, max_size=4))
def test_the_merge_routes_what_some_node_routes(nodes: list[NodeRecord]) -> None:
    """Untagged: the union of the nodes' routes. Tagged N: applied when some node applies
    it, held for a replay when some node is loading it and none applies it, a dead letter
    when every node would dead-letter it."""
    doc = merge(nodes)["m"]
    assert isinstance(doc, dict) and isinstance(doc["versions"], dict)
    merged = {int(n): Point(v["state"], 0) for n, v in doc["versions"].items()}
    assert routed(merged, None) == set().union(*(routed(points(r), None) for r in nodes))  # type: ignore[arg-type]
    for tag in range(1, 6):
        each = [routed(points(r), tag) for r in nodes]
        if {tag} in each:
            assert routed(merged, tag) == {tag}
        elif set() in each:
            assert routed(merged, tag) == set()
        else:
            assert routed(merged, tag) == "dead letter"


def test_a_node_publishes_its_models_as_its_registry_reads_them(tmp_path: Path) -> None:
    doc = {"models": [ENTRY], "volatile_db": {"type": "hash_map"},
           "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "l3")}}  # fmt: skip
    config = parse_config(doc, str(tmp_path / "ps.json"))
    registry = VersionRegistry(config)
    [v1] = node_record(registry).models["m"].versions.values()  # nothing recorded: implicit
    assert (v1.version, v1.state) == (1, "live")
    registry.begin(config.model("m"), 2)
    record = node_record(registry).models["m"]
    assert {n: v.state for n, v in record.versions.items()} == {1: "live", 2: "loading"}
    assert not record.removed and not record.runtime


def test_only_a_consumer_without_an_l3_follows_the_nodes_records(tmp_path: Path) -> None:
    doc = {"models": [ENTRY], "volatile_db": {"type": "redis", "address": "127.0.0.1:1"},
           "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "l3")}}  # fmt: skip
    with pytest.raises(ConfigError, match="no L3 of its own"):
        follow(parse_config(doc, str(tmp_path / "ps.json")))
    doc.update(volatile_db={"type": "hash_map"}, persistent_db={"type": "disabled"})
    with pytest.raises(ConfigError, match="shared through a Redis L2"):
        follow(parse_config(doc, str(tmp_path / "ps.json")))


def test_a_consumer_does_not_merge_over_a_serving_nodes_own_record(tmp_path: Path) -> None:
    """A serving node with this ps.json and no L3 on the same host keeps its record where
    the consumer would keep the merge: refused rather than overwritten."""
    doc = {"models": [ENTRY], "volatile_db": {"type": "redis", "address": "127.0.0.1:1"},
           "persistent_db": {"type": "disabled"}}  # fmt: skip
    config = parse_config(doc, str(tmp_path / "ps.json"))
    registry = VersionRegistry(config)
    assert registry.path is not None
    registry.path.write_text('{"hps:merged-from-nodes": ["a"], "m": {"versions": {}}}')
    RecordFollower(config).close()  # a merge of before: taken over
    registry.path.write_text('{"m": {"versions": {}}}')
    with pytest.raises(ConfigError, match="version record of a serving node on this host"):
        RecordFollower(config)


def test_the_loop_outlives_an_unexpected_error() -> None:
    import threading

    calls: list[int] = []
    done = threading.Event()

    def tick() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("a bug, not a backend")
        done.set()

    loop = _Every("test loop", 0.01, tick)
    loop.start()
    try:
        assert done.wait(10)
    finally:
        loop.close()

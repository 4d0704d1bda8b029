"""How serving L1s learn of updates (``Topology.l1_refresh``), decided once from the ps.json,
and what the serving side starts for each; the table entries a shared L2 needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.config import PSConfig
from hps.config.segment import MAX_TABLES
from hps.errors import ConfigError
from hps.topology import (
    check_shared_l2_tables,
    describe,
    shared_l2_tables,
    shared_l2_versions_note,
    topology,
)
from hps.triton.model.session import open_journal
from hps.updates.journal import journal_dir
from tests.helpers import make_config

KAFKA = {"type": "kafka_message_queue", "brokers": "127.0.0.1:9"}
SHARED_L2 = {"type": "multi_process_hash_map", "shared_memory_name": "hps_topo_test"}


MODEL = {
    "model": "demo",
    "embedding_table_names": ["t0"],
    "embedding_vecsize_per_table": [4],
    "gpucache": True,  # an L1 to keep fresh
}


def _config(tmp_path: Path, l2: dict[str, str], **update_source: str) -> PSConfig:
    return make_config(
        tmp_path, models=[MODEL], volatile_db=l2, update_source={**KAFKA, **update_source}
    )


@pytest.mark.parametrize(
    ("l2", "asked", "refresh"),
    [
        (SHARED_L2, {}, "listener"),  # the default: each serving process reads the topics
        (SHARED_L2, {"hps_l1_refresh": "journal"}, "journal"),
        ({"type": "disabled"}, {"hps_l1_refresh": "journal"}, "journal"),  # L3 only
        ({"type": "hash_map"}, {"hps_l1_refresh": "journal"}, "applier"),  # embedded applier
    ],
)
def test_l1_refresh(
    tmp_path: Path, l2: dict[str, str], asked: dict[str, str], refresh: str
) -> None:
    topo = topology(_config(tmp_path, l2, **asked))
    assert topo.l1_refresh == refresh
    lines = "\n".join(describe(topo))
    if refresh == "journal":
        assert "serving L1s: told by hps consume through the node's change journal" in lines
    elif refresh == "listener":
        assert "serving L1s: each serving process listens to the topics" in lines


def test_journal_mode_starts_no_listener(tmp_path: Path) -> None:
    """The process's journal follower refreshes L1: no Kafka consumer in a serving process."""
    config = _config(tmp_path, {"type": "disabled"}, hps_l1_refresh="journal")
    _assert_no_listener(config)


def _assert_no_listener(config: PSConfig) -> None:
    """A serving session of ``config`` (an L3 secondary with L1s) starts no update thread."""
    from hps.build import build_session
    from hps.updates.runtime import start_updates

    build_session(config, l3_mode="read_write").close()  # the database exists
    session = build_session(config, l3_mode="secondary")
    try:
        assert session.caches  # a listener would start for these
        assert start_updates(session, config) is None
    finally:
        session.close()


def test_no_listener_follows_a_model_update_filters_leave_out(tmp_path: Path) -> None:
    """L1 follows what hps consume applies: a model no tier takes updates of (its
    update_filters) starts no listener, whose L1 would serve updates L2 and L3 never took."""
    from hps.updates.runtime import consumed_models

    config = make_config(
        tmp_path,
        models=[MODEL],
        volatile_db={"type": "disabled"},
        persistent_db={"type": "rocks_db", "path": str(tmp_path / "l3"),
                       "update_filters": ["^other$"]},
        update_source=KAFKA,
    )  # fmt: skip
    assert not consumed_models(config)("demo") and consumed_models(config)("other")
    _assert_no_listener(config)


def test_journal_mode_refuses_a_journal_it_cannot_open(tmp_path: Path) -> None:
    config = _config(tmp_path, {"type": "disabled"}, hps_l1_refresh="journal")
    journal_dir(Path(config.persistent_db.path)).write_text("not a folder")
    args = {"model_instance_name": "demo_0"}
    with pytest.raises(ConfigError, match="hps_l1_refresh is 'journal'"):
        open_journal(config, "demo", args)
    listener = _config(tmp_path, {"type": "disabled"})
    assert open_journal(listener, "demo", args) is None  # writes reach it by reloads


def _tables(tmp_path: Path, counts: dict[str, int], keep: int = 2, **top: object) -> PSConfig:
    models = [
        {"model": m, "embedding_vecsize_per_table": [4] * n, "hps_keep_versions": keep}
        for m, n in counts.items()
    ]
    return make_config(tmp_path, models=models, volatile_db=SHARED_L2, **top)


def test_a_shared_l2_needs_an_entry_per_table(tmp_path: Path) -> None:
    """Every table takes one of the segment's MAX_TABLES entries, and three where its update
    versions are kept in L2 (Kafka and no L3); kept versions beyond those are a note of the
    plan, not a refusal (they fail to load, and Triton stays on the version it served)."""
    assert MAX_TABLES == 256
    fits = _tables(tmp_path, {"a": 200, "b": 56})
    assert shared_l2_tables(fits) == {"a": 200, "b": 56}
    assert shared_l2_tables(fits, versions=2) == {"a": 400, "b": 112}
    check_shared_l2_tables(fits)
    assert "the models' kept versions need 512" in str(shared_l2_versions_note(fits))
    assert shared_l2_versions_note(_tables(tmp_path, {"a": 128})) is None
    with pytest.raises(ConfigError) as err:
        check_shared_l2_tables(_tables(tmp_path, {"a": 200, "b": 57}))
    assert "holds at most 256 tables; the models need 257 (a: 200 tables, b: 57" in str(err.value)
    no_l3 = {"persistent_db": {"type": "disabled"}, "update_source": KAFKA}
    assert shared_l2_tables(_tables(tmp_path, {"a": 85}, **no_l3)) == {"a": 255}
    with pytest.raises(ConfigError, match=r"x 3 \(each with its 2 update-version side tables"):
        check_shared_l2_tables(_tables(tmp_path, {"a": 86}, **no_l3))
    hash_map = make_config(
        tmp_path, models=[{"model": "a", "embedding_vecsize_per_table": [4] * 300}]
    )
    assert shared_l2_tables(hash_map) == {}  # one per process, no bound of entries
    check_shared_l2_tables(hash_map)

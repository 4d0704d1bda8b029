"""How serving L1s learn of updates (``Topology.l1_refresh``), decided once from the ps.json,
and what the serving side starts for each."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.config import PSConfig
from hps.errors import ConfigError
from hps.topology import describe, topology
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

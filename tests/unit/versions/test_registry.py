"""The node's version record: states, the live version, what is kept and served."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.config import PSConfig
from hps.errors import ConfigError, UnknownTableError
from hps.types import MAX_VERSION, TableSpec
from hps.versions import VersionRegistry
from tests.helpers import make_config


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


def add(registry: VersionRegistry, version: int, state: str = "ready") -> None:
    registry.begin(registry.config.model("demo"), version)
    if state != "loading":
        registry.set_state("demo", version, "ready")


def test_a_model_without_a_record_is_version_1_live(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    [v1] = registry.versions("demo")
    assert (v1.version, v1.state, registry.live("demo")) == (1, "live", 1)
    assert registry.served("demo") == [1]
    assert registry.model_at("demo", 1) == config.model("demo")
    assert registry.path is not None and not registry.path.exists()  # reading writes nothing


def test_versions_have_their_own_table_namespaces() -> None:
    spec = TableSpec("demo", "t0", 4)
    assert spec.name == "demo.t0" == spec.qualified
    v2 = TableSpec("demo", "t0", 4, version=2)
    assert (v2.name, v2.qualified) == ("demo.t0@2", "demo.t0")


def test_import_activate_and_rollback_states(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    add(registry, 2, "loading")
    assert [(v.version, v.state) for v in registry.versions("demo")] == [
        (1, "live"),
        (2, "loading"),
    ]
    with pytest.raises(ConfigError, match="loading"):
        registry.model_at("demo", 2)
    with pytest.raises(ConfigError, match="not ready"):
        registry.set_live("demo", 2)
    registry.set_state("demo", 2, "ready")
    assert registry.model_at("demo", 2).tables[0].name == "demo.t0@2"
    registry.set_live("demo", 2)
    assert registry.live("demo") == 2 and registry.served("demo") == [1, 2]
    # a rollback: version 2 stays kept, but is not served (Triton would route to it)
    registry.set_live("demo", 1)
    assert registry.served("demo") == [1] and registry.kept("demo") == [1, 2]
    states = {v.version: v.state for v in VersionRegistry(config).versions("demo")}
    assert states == {1: "live", 2: "ready"}  # recorded, read back by another reader


def keeping(tmp_path: Path, keep: int) -> VersionRegistry:
    """A registry of model demo with ``hps_keep_versions`` = ``keep``."""
    entry = make_config(tmp_path).model("demo").model_dump(mode="json")
    return VersionRegistry(make_config(tmp_path, models=[{**entry, "hps_keep_versions": keep}]))


def test_the_version_live_before_is_kept_for_rollback(config: PSConfig) -> None:
    """Activating 2 while 3 is imported already keeps 1, live a moment ago (what a
    rollback returns to), and 3 (imported for a later activation): nothing is retired."""
    registry = VersionRegistry(config)
    for n in (2, 3):
        add(registry, n)
    assert registry.kept("demo", live=2) == [1, 2, 3]
    assert registry.served("demo", live=2) == [1, 2]
    registry.set_live("demo", 2)
    assert registry.beyond_kept("demo") == [] and registry.served("demo") == [1, 2]
    registry.set_live("demo", 3)  # 2 live before it: kept and served, 1 beyond
    assert registry.kept("demo") == [2, 3] and registry.beyond_kept("demo") == [1]
    assert VersionRegistry(config).served("demo") == [2, 3]  # read back by another reader


def test_keep_versions_bounds_what_is_kept(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    for n in (2, 3, 4):
        add(registry, n)
    registry.set_live("demo", 2)
    registry.set_live("demo", 4)
    assert registry.kept("demo") == [2, 4]  # hps_keep_versions = 2: live, and live before
    assert registry.beyond_kept("demo") == [1, 3]
    assert registry.served("demo") == [2, 4]
    for n in (1, 3):
        registry.set_state("demo", n, "retired")  # what the activation of 4 retires
    registry.set_live("demo", 2)  # a rollback: 4, above the live one, kept but not served
    assert registry.kept("demo") == [2, 4] and registry.served("demo") == [2]


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        (1, [4, 5]),  # the live one, and 5 above it (imported for a later activation)
        (2, [2, 4, 5]),  # and 2, live before 4
        (3, [2, 3, 4, 5]),  # and the highest other below the live one
        (4, [1, 2, 3, 4, 5]),
        (7, [1, 2, 3, 4, 5]),
    ],
)
def test_every_keep_count_keeps_that_many_versions(
    tmp_path: Path, keep: int, kept: list[int]
) -> None:
    """The live one, the one live before it, the highest others below the live one,
    ``hps_keep_versions`` in all (or all there are); those above the live one besides."""
    registry = keeping(tmp_path, keep)
    for n in (2, 3, 4, 5):
        add(registry, n)
    registry.set_live("demo", 2)
    assert registry.kept("demo", live=4) == kept
    assert registry.served("demo", live=4) == [v for v in kept if v <= 4]
    registry.set_live("demo", 4)
    assert registry.kept("demo") == kept
    assert registry.beyond_kept("demo") == [v for v in (1, 2, 3, 5) if v not in kept]


def test_what_triton_serves_stays_recorded_when_a_later_import_changes_what_is_kept(
    tmp_path: Path,
) -> None:
    registry = keeping(tmp_path, 3)
    for n in (4, 5):
        add(registry, n)
    registry.set_live("demo", 4)
    registry.set_live("demo", 5, served=[1, 4, 5])  # what an activation gave Triton
    add(registry, 3)  # imported since, below the live one: kept is now [3, 4, 5]
    assert registry.kept("demo") == [3, 4, 5] and registry.served("demo") == [1, 4, 5]
    assert registry.served("demo", live=5) == [3, 4, 5]  # what the next activation would give
    from hps.versions.rollout import retire

    with pytest.raises(ConfigError, match="version 1 is served"):
        retire(registry.config, "demo", 1)  # Triton still routes version-1 requests to its rows
    registry.set_live("demo", 5)  # recorded with what it computes
    assert registry.served("demo") == [3, 4, 5]


def test_numbers_are_never_reused_and_the_live_one_cannot_retire(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    add(registry, 2)
    registry.set_state("demo", 2, "retired")
    with pytest.raises(ConfigError, match="version 2 exists \\(retired\\); import under"):
        add(registry, 2)
    registry.begin(config.model("demo"), 3)  # an import that died: retiring it frees its rows
    with pytest.raises(ConfigError, match="exists \\(loading\\) \\(an import of it runs, or died"):
        add(registry, 3)
    with pytest.raises(ConfigError, match="is live"):
        registry.set_state("demo", 1, "retired")
    with pytest.raises(UnknownTableError, match="no version 7"):
        registry.set_live("demo", 7)
    with pytest.raises(ConfigError, match="positive"):
        registry.begin(config.model("demo"), 0)


def test_a_version_number_above_max_version_is_refused(config: PSConfig) -> None:
    """The control plane's and the command line's bound, 2**31 - 1: the record refuses a
    number above it too (a caller in Python), recording nothing."""
    registry = VersionRegistry(config)
    with pytest.raises(ConfigError, match=f"positive integers up to {MAX_VERSION}, not 2147483648"):
        registry.begin(config.model("demo"), MAX_VERSION + 1)
    assert [v.version for v in registry.versions("demo")] == [1]
    add(registry, MAX_VERSION)
    assert registry.get("demo", MAX_VERSION).state == "ready"


def test_a_failed_import_leaves_no_record(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    add(registry, 2, "loading")
    registry.forget("demo", 2)
    assert [v.version for v in registry.versions("demo")] == [1]


def test_a_node_without_state_folder_has_version_1_only(tmp_path: Path) -> None:
    config = make_config(tmp_path, persistent_db={"type": "disabled"})
    registry = VersionRegistry(config)
    assert registry.path is None and registry.live("demo") == 1
    with pytest.raises(ConfigError, match="need a node state folder"):
        add(registry, 2)


def test_a_damaged_record_is_a_clear_error(config: PSConfig) -> None:
    registry = VersionRegistry(config)
    assert registry.path is not None
    registry.path.write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable version record"):
        registry.live("demo")

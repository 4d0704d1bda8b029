"""Keys of HugeCTR's ps.json read as HugeCTR read them: thresholds above 1, its documented
``initialize_after_startup``, short default lists, and bounds where HugeCTR had none that
would otherwise break HPS later (an empty device list, a refresh interval past any wait)."""

from __future__ import annotations

import copy
import threading
import warnings
from typing import Any

import pytest

from hps.config import parse_config
from hps.errors import ConfigError

BASE: dict[str, Any] = {
    "models": [
        {
            "model": "wdl",
            "embedding_table_names": ["a", "b", "c"],
            "embedding_vecsize_per_table": [1, 16, 4],
        }
    ]
}


def doc(**model: object) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out["models"][0].update(model)
    return out


@pytest.mark.parametrize("value", [1.0, 1.1, "1.1", 2])
def test_a_hit_rate_threshold_above_1_is_accepted(value: object) -> None:
    """HugeCTR's documented way to disable asynchronous insertion (its ps_template.json
    writes "1.1", a string)."""
    model = parse_config(doc(hit_rate_threshold=value)).models[0]
    assert model.hit_rate_threshold == float(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_a_hit_rate_threshold_must_be_a_finite_number_from_0(value: float) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.hit_rate_threshold"):
        parse_config(doc(hit_rate_threshold=value))


@pytest.mark.parametrize("section", ["volatile_db", "persistent_db"])
@pytest.mark.parametrize("value", [True, False])
def test_initialize_after_startup_is_accepted_and_ignored(section: str, value: bool) -> None:
    cfg = parse_config({**doc(), section: {"initialize_after_startup": value}})
    assert "initialize_after_startup" not in getattr(cfg, section).model_dump()


def test_initialize_after_startup_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match=r"volatile_db: .*initialize_after_startup"):
        parse_config({**doc(), "volatile_db": {"initialize_after_startup": "later"}})


def test_fewer_default_values_than_tables_pad_with_0_as_hugectr_does() -> None:
    with pytest.warns(UserWarning, match=r"wdl: default_value_for_each_table gives 2 values"):
        cfg = parse_config(doc(default_value_for_each_table=[0.5, -1.0]))
    assert [t.default_value for t in cfg.models[0].tables] == [0.5, -1.0, 0.0]


def test_one_default_value_is_the_first_tables_only() -> None:
    with pytest.warns(UserWarning, match=r"tables \['b', 'c'\] get 0\.0"):
        cfg = parse_config(doc(default_value_for_each_table=[1.0]))
    assert [t.default_value for t in cfg.models[0].tables] == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("given", [None, [], [0.0], [0.0, 0.0, 0.0], [0.5, -1.0, 2.0]])
def test_default_values_padding_nothing_that_matters_warn_nothing(given: list | None) -> None:
    model = doc() if given is None else doc(default_value_for_each_table=given)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = parse_config(model)
    expected = given[:3] if given else []
    assert [t.default_value for t in cfg.models[0].tables] == expected + [0.0] * (3 - len(expected))


def test_more_default_values_than_tables_are_refused() -> None:
    with pytest.raises(ConfigError, match="default_value_for_each_table has 4 entries"):
        parse_config(doc(default_value_for_each_table=[0.0] * 4))


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([], "deployed_device_list: .*at least one"),
        ([-1], r"deployed_device_list\[0\]: Input should be greater than or equal to 0"),
        ([0, -2], r"deployed_device_list\[1\]"),
    ],
)
def test_deployed_device_list_needs_a_device_index(devices: list[int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(doc(deployed_device_list=devices))


def test_deployed_device_list_takes_hugectrs_strings() -> None:
    assert parse_config(doc(deployed_device_list=["0", "3"])).models[0].deployed_device_list == [
        0,
        3,
    ]


@pytest.mark.parametrize("key", ["refresh_interval", "refresh_delay"])
@pytest.mark.parametrize("value", [1e10, float(threading.TIMEOUT_MAX), float("inf"), "nan"])
def test_refresh_times_beyond_a_year_or_not_finite_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"models\[0\]\.{key}"):
        parse_config(doc(**{key: value}))


@pytest.mark.parametrize("key", ["refresh_interval", "refresh_delay"])
def test_refresh_times_up_to_a_year_are_accepted(key: str) -> None:
    assert getattr(parse_config(doc(**{key: 31_536_000})).models[0], key) == 31_536_000

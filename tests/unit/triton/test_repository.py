"""Model repositories prepared from the model_repository/ templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hps.cache.xp import usable_cupy
from hps.config import load_config, parse_config
from hps.errors import ConfigError
from hps.triton.repository import (
    QueuePolicy,
    check_gpu_instances,
    prepare_repository,
    render_config,
    served_models,
    templates_dir,
)


def test_render_config_fills_name_count_and_parameters() -> None:
    text = (templates_dir() / "hps_embedding" / "config.pbtxt").read_text()
    out = render_config(text, "wdl", 3, {"ps_config": '/a "b"/ps.json', "hps_model": "wdl"})
    assert 'name: "wdl"' in out and 'name: "hps_embedding"' not in out
    assert "count: 3" in out
    assert r'string_value: "/a \"b\"/ps.json"' in out
    assert 'key: "hps_model", value: { string_value: "wdl" }' in out
    assert "max_batch_size: 1024" in out  # HugeCTR's interface is kept
    with pytest.raises(ConfigError, match="no parameter 'nope'"):
        render_config(text, "wdl", 1, {"nope": "x"})


@pytest.mark.parametrize(
    ("instances", "gpus", "groups"),
    [
        (3, (), "{ count: 3, kind: KIND_CPU }"),
        (1, (2,), "{ count: 1, kind: KIND_GPU, gpus: [ 2 ] }"),
        (
            3,
            (0, 1),
            "{ count: 2, kind: KIND_GPU, gpus: [ 0 ] }, { count: 1, kind: KIND_GPU, gpus: [ 1 ] }",
        ),
        (1, (0, 1), "{ count: 1, kind: KIND_GPU, gpus: [ 0 ] }"),  # no group of 0 instances
    ],
)
def test_gpu_instances_are_spread_round_robin(
    instances: int, gpus: tuple[int, ...], groups: str
) -> None:
    """Triton counts a group's instances per listed GPU, so each GPU gets its own group
    and the counts add up to the model's instances."""
    text = (templates_dir() / "hps_embedding" / "config.pbtxt").read_text()
    out = render_config(text, "wdl", instances, {}, gpus=gpus)
    assert f"\ninstance_group [ {groups} ]\n" in out
    assert out.count("instance_group") == 1


def test_a_model_with_l1_on_the_gpu_gets_gpu_instances(tmp_path: Path) -> None:
    doc = json.loads(write_ps(tmp_path, "dense.npz", 3).read_text())
    model = doc["models"][0]
    model.update(deployed_device_list=[1, 0, 1], hps_cache={"device": "cupy"})
    served = served_models(parse_config(doc, str(tmp_path / "ps.json")))
    assert [(s.triton_name, s.instances, s.gpus) for s in served] == [
        ("wdl", 3, (1, 0)),
        ("wdl_ctr", 3, (1, 0)),
    ]
    # without a usable GPU here, hps serve says so before Triton starts
    if usable_cupy() is None:
        with pytest.raises(ConfigError, match=r"wdl set hps_cache.device 'cupy'.*no usable GPU"):
            check_gpu_instances(parse_config(doc, "ps.json"))
    for device, gpucache in (("auto", True), ("numpy", True), ("cupy", False)):
        model.update(hps_cache={"device": device}, gpucache=gpucache)
        config = parse_config(doc, "ps.json")
        assert [s.gpus for s in served_models(config)] == [(), ()]
        check_gpu_instances(config)  # CPU instances need no GPU


def write_ps(tmp_path: Path, dense_file: str, instances: int) -> Path:
    doc = {
        "models": [
            {
                "model": "wdl",
                "embedding_vecsize_per_table": [4],
                "dense_file": dense_file,
                "hps_instances": instances,
            }
        ]
    }
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(doc))
    return path


def test_prepare_repository_with_a_ctr_model(tmp_path: Path) -> None:
    config = load_config(write_ps(tmp_path, "dense.npz", 2))
    names = prepare_repository(config, tmp_path / "repo", base_dir=tmp_path, metrics_interval_s=0)
    assert names == ["wdl", "wdl_ctr"]
    for name, inputs in (("wdl", "NUMKEYS"), ("wdl_ctr", "ROWINDEX")):
        text = (tmp_path / "repo" / name / "config.pbtxt").read_text()
        assert f'name: "{name}"' in text and inputs in text and "count: 2" in text
        assert f'string_value: "{(tmp_path / "ps.json").resolve()}"' in text
        assert 'key: "metrics_interval_s", value: { string_value: "0" }' in text
        assert (tmp_path / "repo" / name / "1" / "model.py").is_file()


TEMPLATES = ("hps_embedding", "hps_ctr", "hps_floor")
BATCHER = """
dynamic_batching {
  preferred_batch_size: [ 1 ]
  max_queue_delay_microseconds: 0
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: %d
    allow_timeout_override: true
    max_queue_size: %d
  }
}
instance_group [ { count: 3, kind: KIND_CPU } ]
"""


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_model_gets_the_dynamic_batcher_only_for_a_bounded_queue(template: str) -> None:
    """Its queue policy, with one request per execute(): a preferred batch of 1 request
    and no delay (Triton then never puts two requests into one batch); unbounded (the
    default), Triton's default scheduler as before."""
    text = (templates_dir() / template / "config.pbtxt").read_text()
    assert "\ndynamic_batching" not in text
    assert "\ndynamic_batching" not in render_config(text, "m", 3, {})
    out = render_config(text, "m", 3, {}, queue=QueuePolicy(7, 250_000))
    assert BATCHER % (250_000, 7) in out and out.count("dynamic_batching {") == 1
    assert out.count("{") == out.count("}")


def test_a_models_queue_settings_reach_both_of_its_triton_models(tmp_path: Path) -> None:
    doc = json.loads(write_ps(tmp_path, "dense.npz", 3).read_text())
    assert [s.queue for s in served_models(parse_config(doc, "ps.json"))] == [QueuePolicy()] * 2
    assert not QueuePolicy().bounded
    for size, seconds, want in (
        (5, 0.25, (250_000, 5)),
        (0, 1.0, (1_000_000, 0)),  # a bound on the time only
        (64, 0.0, (0, 64)),  # on the size only
        (0, 0.0, None),  # no bound (the default): no dynamic batcher
    ):
        model = doc["models"][0]
        model.update(hps_max_queue_size=size, hps_queue_timeout_s=seconds)
        config = parse_config(doc, str(tmp_path / "ps.json"))
        assert prepare_repository(config, tmp_path / "repo") == ["wdl", "wdl_ctr"]
        for name in ("wdl", "wdl_ctr"):
            text = (tmp_path / "repo" / name / "config.pbtxt").read_text()
            if want is None:
                assert "\ndynamic_batching" not in text and "count: 3" in text
            else:
                assert BATCHER % want in text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hps_max_queue_size", -1),
        ("hps_max_queue_size", 2**31),
        ("hps_max_queue_size", 1.5),
        ("hps_queue_timeout_s", -0.1),
        ("hps_queue_timeout_s", float("inf")),
        ("hps_queue_timeout_s", float("nan")),
        ("hps_queue_timeout_s", 3601),
    ],
)
def test_queue_settings_out_of_range_are_refused(key: str, value: float) -> None:
    doc = {"models": [{"model": "m", "embedding_vecsize_per_table": [8], key: value}]}
    with pytest.raises(ConfigError, match=rf"models\[0\]\.{key}"):
        parse_config(doc, "ps.json")


def test_hugectr_dense_files_get_no_ctr_model(tmp_path: Path) -> None:
    config = load_config(write_ps(tmp_path, "wdl_dense_20000.model", 1))
    assert prepare_repository(config, tmp_path / "repo") == ["wdl"]


def test_missing_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPS_MODEL_REPOSITORY", str(tmp_path))
    with pytest.raises(ConfigError, match="no model templates"):
        templates_dir()


def _newest_mtime(folder: Path) -> int:
    """What Triton compares to tell a modified version: the newest mtime in its folder."""
    return max(p.stat().st_mtime_ns for p in [folder, *folder.rglob("*")])


def test_a_version_folder_is_not_modified_by_the_stub_importing_its_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each served version's model.py has its bytecode before Triton loads it, so the stub's
    import writes nothing into the folder: Triton keeps the loaded versions at the next load
    of the model (an activation) instead of loading them anew."""
    import importlib.util
    import sys
    import time

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the stub writes bytecode

    from hps.triton.repository import write_versions

    model_dir = tmp_path / "demo"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text("ANSWER = 42\n")
    (model_dir / "config.pbtxt").write_text('name: "demo"\n')
    write_versions(model_dir, [1, 2])
    before = {v: _newest_mtime(model_dir / v) for v in ("1", "2")}
    time.sleep(0.01)  # a write now would show as a newer mtime
    for v in ("1", "2"):  # as the stub imports a version's model.py
        spec = importlib.util.spec_from_file_location(f"m{v}", model_dir / v / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.ANSWER == 42
    assert {v: _newest_mtime(model_dir / v) for v in ("1", "2")} == before
    assert "specific: { versions: [ 1, 2 ] }" in (model_dir / "config.pbtxt").read_text()

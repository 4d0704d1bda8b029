"""Which serving process writes L3 when a model is served twice (``<model>``, ``<model>_ctr``).

With Kafka and an in-process L2, each serving process applies the updates itself, and the
embedding model's one instance writes L3. Its CTR twin is a second process on the same
database: it must follow as a secondary whichever of the two starts first, so the writer is
never decided by a race and neither logs that the lock was taken from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hps.build import build_session
from hps.config import PSConfig
from hps.topology import describe, topology
from hps.triton.model.session import instance_device, open_session
from tests.helpers import make_config


def _config(tmp_path: Path, dense_file: str, gpucache: bool = False) -> PSConfig:
    return make_config(
        tmp_path,
        models=[
            {
                "model": "demo",
                "embedding_table_names": ["t0"],
                "embedding_vecsize_per_table": [4],
                "maxnum_catfeature_query_per_table_per_sample": [2],
                "default_value_for_each_table": [0.0],
                "max_batch_size": 16,
                "gpucache": gpucache,
                "dense_file": dense_file,
            }
        ],
        update_source={"type": "kafka_message_queue", "brokers": "127.0.0.1:9"},
    )


@pytest.mark.parametrize("twin_first", [True, False])
def test_the_ctr_twin_follows_the_embedding_models_writer(
    tmp_path: Path, twin_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, str(tmp_path / "dense.npz"))
    model = config.model("demo")
    placement = topology(config).model("demo")
    assert (placement.l3_mode, placement.ctr_l3_mode) == ("read_write", "secondary")
    assert "demo_ctr: L3 opened secondary" in "\n".join(describe(topology(config)))

    # the database exists (the import made it) before a secondary can open it
    build_session(make_config(tmp_path), l3_mode="read_write").close()
    caplog.set_level(logging.WARNING)
    order = [True, False] if twin_first else [False, True]
    modes: dict[bool, str] = {}
    sessions = []
    for ctr in order:
        session, mode = open_session(config, model, ctr=ctr)
        sessions.append(session)
        modes[ctr] = mode
    try:
        assert modes == {False: "read_write", True: "secondary"}
        writable = {}
        for ctr, s in zip(order, sessions, strict=True):
            assert s.tiers.persistent is not None
            writable[ctr] = s.tiers.persistent.writable
        assert writable == {False: True, True: False}
        assert not [r for r in caplog.records if "lock held" in r.getMessage()]
    finally:
        for s in sessions:
            s.close()


def test_a_model_without_a_ctr_twin_has_no_twin_mode(tmp_path: Path) -> None:
    config = _config(tmp_path, "")
    assert topology(config).model("demo").ctr_l3_mode is None
    assert "demo_ctr" not in "\n".join(describe(topology(config)))


def test_a_gpu_instance_keeps_its_l1_on_the_gpu_triton_placed_it_on() -> None:
    gpu = {"model_instance_kind": "GPU", "model_instance_device_id": "3"}
    assert instance_device(gpu) == 3
    assert instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"}) is None


def test_a_ctr_instance_times_its_l1_with_the_rows_kept_on_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hps_cache.device: auto`` times the GPU path as the instance serves: a CTR instance
    keeps the rows on the GPU (hps.cache.calibrate), the embedding model brings them back."""
    import numpy as np

    from hps.cache import auto
    from hps.cache.auto import L1Device

    asked: dict[bool, bool] = {}

    def choose(model: object, *, rows_on_device: bool = False, **_: object) -> object:
        asked[ctr] = rows_on_device
        return L1Device("demo", "numpy", "no_gpu"), np

    monkeypatch.setattr(auto, "choose_l1_device", choose)
    config = _config(tmp_path, str(tmp_path / "dense.npz"), gpucache=True)
    build_session(make_config(tmp_path), l3_mode="read_write").close()
    for ctr in (False, True):
        session, _ = open_session(config, config.model("demo"), ctr=ctr)
        session.close()
    assert asked == {False: False, True: True}

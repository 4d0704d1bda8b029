"""``hps publish`` with a ps.json that has no Kafka: refused at once, nothing contacted."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from hps.cli import main
from hps.config import parse_config
from hps.versions import VersionRegistry
from tests.unit.test_plan import ps_json


def test_no_kafka_in_the_config_and_no_brokers_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_producer(*args: object, **kwargs: object) -> None:
        raise AssertionError("a producer was made")

    monkeypatch.setattr("hps.updates.producer.Publisher.__init__", no_producer)
    config = ps_json(tmp_path)  # update_source: none
    start = time.monotonic()
    code = main(["publish", "--config", str(config), "--table", "m.t0", "--sparse",
                 str(tmp_path / "t0"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - start < 10
    assert f"{config}: update_source.type is 'null' (no Kafka): give --brokers" in err


def test_the_vectors_are_checked_against_the_dims_of_the_version_they_go_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 2, live, was imported with dims 8 and 32 (version 1's ps.json entry: 16 and
    32): an untagged publish takes version 2's dim, one tagged for version 1 version 1's."""

    class Reached(Exception):
        pass

    def publisher(*args: object, **kwargs: object) -> None:
        raise Reached(kwargs.get("version"))

    monkeypatch.setattr("hps.updates.producer.Publisher.__init__", publisher)
    path = ps_json(tmp_path)
    config = parse_config(json.loads(path.read_text()), str(path))
    entry = config.models[0]
    registry = VersionRegistry(config)
    registry.begin(entry.model_copy(update={"embedding_vecsize_per_table": [8, 32]}), 2)
    registry.set_state("m", 2, "ready")
    registry.set_live("m", 2)
    np.save(tmp_path / "k.npy", np.arange(3, dtype=np.int64))
    for dim in (8, 16):
        np.save(tmp_path / f"v{dim}.npy", np.ones((3, dim), np.float32))

    def publish(dim: int, *tag: str) -> int:
        return main(["publish", "--config", str(path), "--table", "m.t0", "--brokers", "x:9",
                     "--npy", str(tmp_path / "k.npy"), str(tmp_path / f"v{dim}.npy"), "--quiet",
                     *tag])  # fmt: skip

    with pytest.raises(Reached):
        publish(8)
    with pytest.raises(Reached, match="1"):
        publish(16, "--model-version", "1")
    assert publish(16) == 2
    assert "vectors must be float (n, 8), got float32(3, 16)" in capsys.readouterr().err
    assert main(["publish", "--config", str(path), "--table", "m.t9", "--brokers", "x:1",
                 "--npy", str(tmp_path / "k.npy"), str(tmp_path / "v8.npy")]) == 2  # fmt: skip
    assert "model 'm' version 2 has no table 't9'" in capsys.readouterr().err


@pytest.mark.parametrize(("table", "bad"), [("pm.x.t0", "table 'x.t0'"), ("p m.t0", "model 'p m'")])
def test_a_table_no_consumer_reads_is_refused_before_a_producer_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    table: str, bad: str,
) -> None:  # fmt: skip
    """--table pm.x.t0 published to hps_et.pm.x.t0, a topic no consumer reads."""

    def no_producer(*args: object, **kwargs: object) -> None:
        raise AssertionError("a producer was made")

    monkeypatch.setattr("hps.updates.producer.Publisher.__init__", no_producer)
    np.save(tmp_path / "k.npy", np.arange(3, dtype=np.int64))
    np.save(tmp_path / "v.npy", np.ones((3, 4), np.float32))
    code = main(["publish", "--table", table, "--brokers", "x:9", "--quiet", "--npy",
                 str(tmp_path / "k.npy"), str(tmp_path / "v.npy")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{bad} cannot name an update topic" in err and "[A-Za-z0-9_-]+" in err

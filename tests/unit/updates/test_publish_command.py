"""``hps publish`` with a ps.json that has no Kafka: refused at once, nothing contacted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hps.cli import main
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

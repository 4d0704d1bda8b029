"""The control plane's L3 reader: a RocksDB secondary caught up at most every CATCH_UP_S,
or at once when asked, and reopened after its own writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.service import state as state_module
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.storage.rocks_db import RocksDBStore
from tests.helpers import make_config, rows


def test_the_reader_catches_up_at_most_every_catch_up_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(tmp_path)
    writer = RocksDBStore(str(tmp_path / "rocksdb"))
    for spec in config.tables:
        writer.open_table(spec)
    spec = config.tables[0]
    state = AdminState(config, None, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "s")
    clock = [1000.0]
    monkeypatch.setattr(state_module.time, "monotonic", lambda: clock[0])
    state.reader()
    keys = np.array([7], np.int64)
    writer.insert(spec.name, keys, rows(keys, spec.dim))
    clock[0] += state_module.CATCH_UP_S / 2
    assert not state.reader().fetch(spec, keys).found.any()  # not yet caught up
    assert state.reader(catch_up=True).fetch(spec, keys).found.all()  # asked: caught up

    more = np.array([8], np.int64)
    writer.insert(spec.name, more, rows(more, spec.dim))
    clock[0] += state_module.CATCH_UP_S
    assert state.reader().fetch(spec, more).found.all()  # due again
    state.reset_reader()
    writer.close()

"""The control plane's L3 reader: a RocksDB secondary caught up at most every
SECONDARY_LAG_S, or at once when asked, and reopened after its own writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import tiers as tiers_module
from hps.types import TableSpec
from tests.helpers import make_config, rows


def _found(state: AdminState, spec: TableSpec, keys: np.ndarray, **kw: bool) -> list[bool]:
    with state.reading(**kw) as reader:
        return reader.fetch(spec, keys).found.tolist()


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
    monkeypatch.setattr(tiers_module.time, "monotonic", lambda: clock[0])
    keys = np.array([7], np.int64)
    assert _found(state, spec, keys) == [False]
    writer.insert(spec.name, keys, rows(keys, spec.dim))
    clock[0] += tiers_module.SECONDARY_LAG_S / 2
    assert _found(state, spec, keys) == [False]  # not yet caught up
    assert _found(state, spec, keys, catch_up=True) == [True]  # asked: caught up

    more = np.array([8], np.int64)
    writer.insert(spec.name, more, rows(more, spec.dim))
    clock[0] += 2 * tiers_module.SECONDARY_LAG_S
    assert _found(state, spec, more) == [True]  # due again
    state.reset_reader()
    writer.close()


def test_a_reader_replaced_under_a_request_closes_when_the_request_ends(tmp_path: Path) -> None:
    """A write of ours reopens the reader; a request still reading through the old one
    finishes on it: closed under it, the read would find nothing (a key answered as
    absent, its default vector)."""
    config = make_config(tmp_path)
    writer = RocksDBStore(str(tmp_path / "rocksdb"))
    for spec in config.tables:
        writer.open_table(spec)
    spec = config.tables[0]
    keys = np.array([7], np.int64)
    writer.insert(spec.name, keys, rows(keys, spec.dim))
    state = AdminState(config, None, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "s")
    with state.reading() as old:
        state.reset_reader()  # another request's write
        with state.reading() as new:
            assert new is not old
        assert old.fetch(spec, keys).found.all()  # still open for the first request
    assert not old.fetch(spec, keys).found.any()  # closed once its last user left
    with state.reading() as again:
        assert again is new and again.fetch(spec, keys).found.all()
    state.close()
    writer.close()

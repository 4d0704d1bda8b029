"""A refresh of L1 while the Redis L2 cannot be reached (frozen with SIGSTOP), with no L3:
the keys no tier could answer for keep their L1 rows (L1 is the one level still serving
them), and a key Redis says is gone still leaves L1 once Redis answers again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.config import load_config
from hps.io.sparse_model import write_sparse_model
from hps.testing.redis import RedisServer
from hps.triton.serving import prepare_tables

pytestmark = pytest.mark.integration

ROWS, DIM = 2000, 4
HANG_S = 30.0  # hang guard only


def test_a_refresh_during_an_l2_outage_keeps_l1_rows(tmp_path: Path) -> None:
    keys = np.arange(ROWS, dtype=np.int64)
    vectors = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) + 1
    write_sparse_model(tmp_path / "t", keys, vectors)
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        doc = {
            "models": [{
                "model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [DIM],
                "sparse_files": [str(tmp_path / "t")], "gpucacheper": 1.0,
                "hps_cache": {"policy": "lru", "device": "numpy"},
            }],
            "volatile_db": {"type": "redis", "address": redis.address,
                            "hps_socket_timeout_s": 0.5, "hps_breaker_backoff_s": 0.2},
        }  # fmt: skip
        (tmp_path / "ps.json").write_text(json.dumps(doc))
        config = load_config(tmp_path / "ps.json")
        prepare_tables(config)
        session = build_session(config)
        try:
            assert np.array_equal(session.lookup("m.t", keys), vectors)
            session.drain()
            cache = session.caches["m.t"]
            assert len(cache) == ROWS
            assert redis.node.pid is not None
            os.kill(redis.node.pid, signal.SIGSTOP)
            try:
                session.refresh("m.t", keys)  # L2 times out: no tier can say anything
            finally:
                os.kill(redis.node.pid, signal.SIGCONT)
            assert len(cache) == ROWS
            assert np.array_equal(session.lookup("m.t", keys[:5]), vectors[:5])
            redis.node.flush()  # gone from L2 (and no L3)
            deadline = time.monotonic() + HANG_S
            while len(cache) == ROWS:  # once the breaker lets L2 be read again
                assert time.monotonic() < deadline
                time.sleep(0.05)
                session.refresh("m.t", keys[:10])
            assert len(cache) == ROWS - 10
        finally:
            session.close()
    finally:
        redis.stop()

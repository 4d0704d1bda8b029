"""Updates published to Kafka are served by Triton: two model instances sharing the node's
``multi_process_hash_map`` L2 over a read-only RocksDB L3, ``hps consume`` writing L2 and L3,
and each instance's L1 listener refreshing its cache."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.io.sparse_model import write_sparse_model
from hps.testing.kafka import TansuBroker
from hps.triton.client import Client
from hps.triton.repository import prepare_repository
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.server import TritonServer
from hps.updates import Publisher
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_source_doc, wait_for

pytestmark = pytest.mark.integration

ROWS, DIM = 300, 8


def _doc(root: Path, model: str, brokers: str) -> dict[str, object]:
    return {
        "models": [
            {
                "model": model,
                "sparse_files": [str(root / "tables" / "u")],
                "embedding_table_names": ["u"],
                "embedding_vecsize_per_table": [DIM],
                "maxnum_catfeature_query_per_table_per_sample": [8],
                "max_batch_size": 16,
                "gpucache": True,
                "hps_cache": {"capacity": 64},  # most keys live in L2 only
                "hps_instances": 2,
            }
        ],
        "volatile_db": {
            "shared_memory_name": f"hps_upd_{uuid.uuid4().hex[:12]}",
            "shared_memory_size": 64 * 1024**2,
            "allocation_rate": 4 * 1024**2,
        },
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
        "update_source": update_source_doc(brokers, model),
    }


def test_updates_are_served_through_triton(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    model = f"upd{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(3)
    keys = rng.choice(1 << 40, size=ROWS, replace=False).astype(np.int64)
    old = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    write_sparse_model(tmp_path / "tables" / "u", keys, old)
    ps_path = tmp_path / "ps.json"
    ps_path.write_text(json.dumps(_doc(tmp_path, model, kafka_broker.bootstrap)))
    config = serving_config(ps_path)
    assert config.volatile_db.type == "multi_process_hash_map"
    names = prepare_repository(config, tmp_path / "repository", metrics_interval_s=0.0)
    prepare_tables(config)
    server = TritonServer(
        tmp_path / "repository", explicit=True, load_models=names, log_file=tmp_path / "t.log"
    )
    server.start()
    writer = build_session(config, with_cache=False)  # L3 read-write next to Triton's readers
    try:
        with (
            running(build_service(config, writer)) as svc,
            Publisher(kafka_broker.bootstrap) as pub,
            Client(server.http_url) as client,
        ):
            hot = keys[:16]
            for _ in range(4):  # both instances see these keys: resident in their L1
                np.testing.assert_array_equal(
                    client.lookup(model, hot, [16]).reshape(16, DIM), old[:16]
                )
            # Half of the updated keys are resident in L1, half only in L2 (and L3).
            changed = np.concatenate([keys[:32], keys[200:232]])
            new = rng.standard_normal((64, DIM), dtype=np.float32)
            pub.publish(model, "u", changed, new)
            pub.flush()

            def served_everywhere() -> bool:
                return all(
                    np.array_equal(
                        client.lookup(model, changed[lo : lo + 8], [8]).reshape(8, DIM),
                        new[lo : lo + 8],
                    )
                    for _ in range(3)
                    for lo in range(0, 64, 8)
                )

            wait_for(served_everywhere, 30, "Triton to serve the published vectors")
            wait_for(lambda: svc.rows_applied >= 64, 30, "hps consume to apply them to L2/L3")
        untouched = client_lookup(server, model, keys[100:108])
        np.testing.assert_array_equal(untouched, old[100:108])
    finally:
        server.stop()
        writer.close()


def client_lookup(server: TritonServer, model: str, keys: np.ndarray) -> np.ndarray:
    with Client(server.http_url) as client:
        return client.lookup(model, keys, [keys.size]).reshape(keys.size, DIM)

"""Freshness measured in production, on real parts: Tansu, tritonserver with the HPS model,
RocksDB, ``hps consume`` (its loop in a thread) and the control plane's app.

After updates are published, every serving process's ``hps_update_freshness_seconds`` count
for the table rises in Triton's /metrics, the consumer's stage histograms count them, and
``GET /v1/models/{model}/tables/{table}`` reports p50/p99. Three layouts: two instances
sharing a ``multi_process_hash_map`` with ``hps consume``, each instance's L1 listener
recording; the same with ``hps_l1_refresh: journal``, each instance's journal follower
recording from hps consume's journal entries (stages ``journal`` and ``l1_refresh`` too);
and one instance on the in-process ``hash_map`` (its embedded applier records, stages too).
No timing is asserted."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hps.build import build_session
from hps.io.sparse_model import write_sparse_model
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin, metrics_text, parse_freshness
from hps.testing.kafka import TansuBroker
from hps.triton.client import Client
from hps.triton.repository import prepare_repository
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.server import TritonServer
from hps.updates import Publisher, codec, metrics
from hps.updates.journal import Journal, journal_dir
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_source_doc, wait_for
from tests.integration.service.conftest import TOKEN

pytestmark = pytest.mark.integration

ROWS, DIM = 300, 8
EMBEDDED_STAGES = (
    "delivery", "batch", "decode", "l3_write", "l2_write", "sync", "l1_refresh", "l1_reread",
    "applied",
)  # fmt: skip
EMBEDDED_UPDATE_METRICS = (  # the embedded applier's own counters, sent on by the stub
    "hps_updates_applied_rows_total{", "hps_updates_messages_total{",
    'hps_updates_dead_letters_total{', 'reason="DecodeError"', "hps_updates_consumer_lag{",
    "hps_updates_batch_seconds_count{", "hps_updates_l1_refreshed_keys_total{",
)  # fmt: skip


def _doc(root: Path, model: str, brokers: str, layout: str) -> dict[str, object]:
    shared = layout != "embedded"
    volatile: dict[str, object] = (
        {
            "shared_memory_name": f"hps_fr_{uuid.uuid4().hex[:12]}",
            "shared_memory_size": 64 * 1024**2,
            "allocation_rate": 4 * 1024**2,
        }
        if shared
        else {"type": "hash_map"}
    )
    updates = update_source_doc(brokers, model)
    if layout == "journal":
        updates["hps_l1_refresh"] = "journal"
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
                "hps_cache": {"capacity": 64},  # most keys live below L1
                "hps_instances": 2 if shared else 1,
            }
        ],
        "volatile_db": volatile,
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
        "update_source": updates,
    }


def _count(metrics_url: str, model: str) -> float:
    found = parse_freshness(metrics_text(metrics_url, 5.0)).get((model, "u"), [])
    return max((c for _, c in found), default=0.0)


def _stage_count(stage: str) -> float:
    for family in metrics.STAGE_SECONDS.collect():
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels.get("stage") == stage:
                return sample.value
    return 0.0


@pytest.mark.parametrize(
    "layout", ["listener", "journal", "embedded"], ids=["listeners+consume", "journal+consume",
    "embedded"]
)  # fmt: skip
def test_freshness_is_exported_and_reported(
    tmp_path: Path, kafka_broker: TansuBroker, layout: str
) -> None:
    shared = layout != "embedded"
    model = f"fr{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(5)
    keys = rng.choice(1 << 40, size=ROWS, replace=False).astype(np.int64)
    old = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    write_sparse_model(tmp_path / "tables" / "u", keys, old)
    ps_path = tmp_path / "ps.json"
    ps_path.write_text(json.dumps(_doc(tmp_path, model, kafka_broker.bootstrap, layout)))
    config = serving_config(ps_path)
    names = prepare_repository(config, tmp_path / "repository", metrics_interval_s=0.0)
    prepare_tables(config)
    server = TritonServer(
        tmp_path / "repository", explicit=True, load_models=names, log_file=tmp_path / "t.log"
    )
    server.start()
    writer = build_session(config, with_cache=False) if shared else None
    applied_before = _stage_count("applied")
    state = AdminState(
        config,
        TOKEN,
        TritonAdmin(server.http_url, metrics_url=server.metrics_url),
        state_dir=tmp_path / "admin",
    )
    try:
        with contextlib.ExitStack() as stack:
            if writer is not None:
                stack.enter_context(running(build_service(config, writer)))
            pub = stack.enter_context(Publisher(kafka_broker.bootstrap))
            client = stack.enter_context(Client(server.http_url))
            for _ in range(4):  # resident in L1 of every instance
                client.lookup(model, keys[:16], [16])
            before = _count(server.metrics_url, model)
            changed = np.concatenate([keys[:8], keys[200:208]])  # resident and not
            for _ in range(3):
                new = rng.standard_normal((changed.size, DIM), dtype=np.float32)
                pub.publish(model, "u", changed, new)
                pub.flush()
            if not shared:  # a bad message: the embedded applier logs and counts it
                pub.produce_raw(codec.topic_name(model, "u"), b"garbage!", 0)
                pub.flush()

            def served() -> bool:
                got = client.lookup(model, changed[:8], [8]).reshape(8, DIM)
                client.lookup(model, changed[8:], [8])
                return bool(np.array_equal(got, new[:8]))

            wait_for(served, 30, "the updates served")

            def counted() -> bool:
                client.lookup(model, keys[:8], [8])  # the exporter sends from request threads
                return _count(server.metrics_url, model) >= before + 3

            wait_for(counted, 30, "hps_update_freshness_seconds to count the updates")
            if shared:  # hps consume's own stage histograms (this process's registry)
                wait_for(lambda: _stage_count("applied") >= applied_before + 3, 30, "stages")
            else:  # the embedded applier's stages travel through Triton's /metrics

                def staged() -> bool:
                    client.lookup(model, keys[:8], [8])
                    text = _metrics_text(server.metrics_url)
                    return all(f'stage="{stage}"' in text for stage in EMBEDDED_STAGES) and all(
                        name in text for name in EMBEDDED_UPDATE_METRICS
                    )

                wait_for(staged, 30, "every stage and counter of the embedded applier in /metrics")
            if layout == "journal":  # the followers took hps consume's entries, no listener

                def followed() -> bool:
                    client.lookup(model, keys[:8], [8])
                    text = _metrics_text(server.metrics_url)
                    return all(f'stage="{stage}"' in text for stage in ("journal", "l1_refresh"))

                wait_for(followed, 30, "the journal followers' stages in /metrics")
                journal = Journal(journal_dir(tmp_path / "rocksdb"))
                _, head = journal.head()
                last = journal.read(head)  # older ones go once every follower applied them
                assert last is not None and last.changes
                assert all(c.from_updates and c.published_ns for c in last.changes)

                def caught_up() -> bool:
                    followers = [c for c in journal.cursors() if c.model == model]
                    return len(followers) == 2 and all(c.seq == head for c in followers)

                wait_for(caught_up, 30, "both instances' followers at the journal's head")
            with TestClient(create_app(state)) as admin:
                admin.headers["Authorization"] = f"Bearer {TOKEN}"
                r = admin.get(f"/v1/models/{model}/tables/u")
                assert r.status_code == 200, r.text
                fresh: dict[str, Any] = r.json()["freshness"]
            assert fresh["count"] >= 3 and "error" not in fresh, fresh
            assert fresh["p50_s"] is not None and fresh["p99_s"] is not None
            assert 0 <= fresh["p50_s"] <= fresh["p99_s"]
    finally:
        server.stop()
        if writer is not None:
            writer.close()


def _metrics_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())

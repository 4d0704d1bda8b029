"""tritonserver's memory over model reloads and over control-plane writes (journal).

    python -m tests.integration.service.reload_memory --reloads 40 --writes 40

Starts the control-plane tests' deployment (tests/integration/service/conftest.py: model
``emb`` with two instances, the node's shared L2, RocksDB, no Kafka) on a real tritonserver,
then reloads ``emb`` N times (``POST /v1/models/emb/reload``), then makes N deletes through
the change journal, printing tritonserver's RSS after each phase as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fastapi.testclient import TestClient

from hps.service.app import create_app
from hps.triton.repository import prepare_repository
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.server import TritonServer
from tests.fixtures.triton import write_tables
from tests.integration.service.conftest import TABLES, TOKEN, Stack, _doc


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reloads", type=int, default=40)
    ap.add_argument("--writes", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hps-reload-mem-") as tmp:
        root = Path(tmp)
        data = write_tables(root / "tables", TABLES, seed_base=10)
        (root / "ps.json").write_text(json.dumps(_doc(root)))
        config = serving_config(root / "ps.json")
        names = prepare_repository(config, root / "repository", metrics_interval_s=0.0)
        prepare_tables(config)
        server = TritonServer(root / "repository", explicit=True, load_models=names)
        server.start()
        try:
            assert server.proc is not None
            pid = server.proc.pid
            stack = Stack(server, config, root, data)
            with TestClient(create_app(stack.state())) as c:
                c.headers["Authorization"] = f"Bearer {TOKEN}"
                start = _rss_kib(pid)
                for _ in range(args.reloads):
                    c.post("/v1/models/emb/reload").raise_for_status()
                reloaded = _rss_kib(pid)
                for i in range(args.writes):
                    body = {"keys": [90_000 + i]}
                    c.request("DELETE", "/v1/models/emb/tables/b/keys", json=body)
                written = _rss_kib(pid)
            report = {
                "reloads": args.reloads,
                "rss_start_kib": start,
                "rss_after_reloads_kib": reloaded,
                "kib_per_reload": round((reloaded - start) / max(args.reloads, 1), 1),
                "writes": args.writes,
                "rss_after_writes_kib": written,
                "kib_per_write": round((written - reloaded) / max(args.writes, 1), 1),
            }
            print(json.dumps(report))
        finally:
            server.stop()


if __name__ == "__main__":
    main()

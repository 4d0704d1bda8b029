"""A Triton deployment of the control plane's own (its tests delete, import and reload).

Models: ``emb`` (tables ``a`` dim 4, ``b`` dim 8; two instances, so the node's
``multi_process_hash_map`` is the L2), ``one`` (table ``r`` dim 4, one instance: the stub
the readiness test kills) and ``big`` (table ``t`` dim 128, no L1: the 1 M-row import).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.triton.repository import prepare_repository
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.server import TritonServer
from tests.fixtures.triton import write_tables
from tests.helpers import running_admin

TOKEN = "s3cret-admin-token"
TABLES = {"emb": [("a", 4, 400), ("b", 8, 300)], "one": [("r", 4, 50)], "big": [("t", 128, 10)]}


@dataclass
class Stack:
    server: TritonServer
    config: PSConfig
    root: Path
    data: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def state(self, token: str | None = TOKEN) -> AdminState:
        triton = TritonAdmin(self.server.http_url, self.server.metrics_url, self.server.admin_key)
        return AdminState(self.config, token, triton, state_dir=self.root / "admin")


def _doc(root: Path) -> dict[str, object]:
    models = []
    for model, tables in TABLES.items():
        models.append(
            {
                "model": model,
                "sparse_files": [str(root / "tables" / model / t) for t, _, _ in tables],
                "embedding_table_names": [t for t, _, _ in tables],
                "embedding_vecsize_per_table": [d for _, d, _ in tables],
                "maxnum_catfeature_query_per_table_per_sample": [4] * len(tables),
                "default_value_for_each_table": [0.5] * len(tables),
                "max_batch_size": 64,
                "gpucache": model != "big",
                "gpucacheper": 1.0,
                "hps_instances": 2 if model == "emb" else 1,
                "init_ec": model != "one",  # `one` starts with an empty L1 (warm-up test)
            }
        )
    return {
        "models": models,
        "volatile_db": {
            "shared_memory_name": f"hps_admin_{uuid.uuid4().hex[:12]}",
            "shared_memory_size": 1024**3,
            "allocation_rate": 4 * 1024**2,
        },
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
    }


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("admin")
    data = write_tables(root / "tables", TABLES, seed_base=10)
    (root / "ps.json").write_text(json.dumps(_doc(root), indent=1))
    config = serving_config(root / "ps.json")
    names = prepare_repository(config, root / "repository", metrics_interval_s=0.0)
    prepare_tables(config)
    log = root / "triton.log"
    server = TritonServer(root / "repository", explicit=True, load_models=names, log_file=log)
    server.start()
    try:
        yield Stack(server, config, root, data)
    finally:
        server.stop()


@pytest.fixture
def client(stack: Stack) -> Iterator[object]:
    from fastapi.testclient import TestClient

    with TestClient(create_app(stack.state())) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        yield c


@dataclass
class AdminProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def admin_process(stack: Stack, tmp_path: Path) -> Iterator[AdminProcess]:
    """``hps admin`` under real uvicorn, the token in a file; stopped by its PID."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    log = tmp_path / "admin.log"
    env = {
        **os.environ,
        "HPS_TRITON_METRICS_URL": stack.server.metrics_url,
        "HPS_ADMIN_KEY": stack.server.admin_key,
    }
    env.pop("HPS_ADMIN_TOKEN", None)
    args = [
        "--config", str(stack.root / "ps.json"), "--triton-url", stack.server.http_url,
        "--token-file", str(token_file),
    ]  # fmt: skip
    with running_admin(args, log, env=env) as (url, proc):
        yield AdminProcess(url, proc, log)

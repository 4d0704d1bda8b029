"""Import jobs of the control plane: what a queued job reads when its turn comes, which
version it writes after a restart, and what a failed upload leaves (real RocksDB files)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hps.io.sparse_model import write_sparse_model
from hps.service import uploads
from hps.service.app import create_app
from hps.service.job_records import Job
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.types import TableSpec
from hps.versions import VersionRegistry
from tests.helpers import make_config, rows

TOKEN = "import-jobs-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HANG_S = 30.0  # hang guards only


def _state(tmp_path: Path) -> AdminState:
    return AdminState(make_config(tmp_path), TOKEN, TritonAdmin("127.0.0.1:1"),
                      state_dir=tmp_path / "s")  # fmt: skip


def _ended(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + HANG_S
    while True:
        view = client.get(f"/v1/jobs/{job}").json()
        if view["state"] not in ("queued", "running"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.02)


def test_a_server_path_is_read_again_when_its_job_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder may change while the job waits: what is written is what is validated
    then (a NaN written meanwhile fails the job; nothing of it reaches L3)."""
    gate = threading.Event()
    import_work = AdminState._import_work

    def after_the_gate(self: AdminState, source: Any, validate: bool) -> Any:
        work = import_work(self, source, validate)

        def gated(job: Job) -> Any:  # the job's turn comes once the folder is rewritten
            assert gate.wait(HANG_S)
            return work(job)

        return gated

    monkeypatch.setattr(AdminState, "_import_work", after_the_gate)
    state = _state(tmp_path)
    folder = tmp_path / "s" / "data"  # under the path roots (the state folder)
    keys = np.arange(1, 11, dtype=np.int64)
    write_sparse_model(folder, keys, rows(keys, 4))
    with TestClient(create_app(state)) as client:
        answer = client.post("/v1/models/demo/tables/t0/import", headers=AUTH,
                             data={"format": "sparse", "path": str(folder)})  # fmt: skip
        assert answer.status_code == 202, answer.text
        bad = rows(keys, 4)
        bad[0, 0] = np.nan
        write_sparse_model(folder, keys, bad)  # rewritten while the job is queued
        gate.set()
        view = _ended(client, answer.json()["job"])
        assert view["state"] == "failed" and "NaN" in str(view["error"]), view
    assert not Path(state.config.persistent_db.path).exists()  # nothing was written


def test_a_queued_import_is_not_resumed_into_another_version(tmp_path: Path) -> None:
    state = _state(tmp_path)
    job = Job("import", "demo.t0", 10, params={"model": "demo", "table": "t0",
              "version": "1", "format": "sparse", "folder": str(tmp_path)})  # fmt: skip
    registry = VersionRegistry(state.config)
    registry.begin(state.config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    registry.set_live("demo", 2)  # activated while the control plane was down
    with pytest.raises(ValueError, match="for version 1 of model 'demo'; version 2 is live"):
        state._resume_import(job)


def test_a_job_loads_the_files_it_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files renamed over the path after the job validated them are not what it loads: it
    reads the files it opened (a NaN put there meanwhile never reaches L3)."""
    validate = uploads.validate
    calls: list[int] = []
    folder = tmp_path / "s" / "data"
    keys = np.arange(1, 11, dtype=np.int64)

    def then_replaced(*args: Any) -> Any:
        done = validate(*args)
        calls.append(1)
        if len(calls) == 2:  # the job's own reading: swap the files before its load
            bad = rows(keys, 4)
            bad[0, 0] = np.nan
            write_sparse_model(tmp_path / "other", keys, bad)
            for name in ("key", "emb_vector"):
                os.replace(tmp_path / "other" / name, folder / name)
        return done

    monkeypatch.setattr(uploads, "validate", then_replaced)
    state = _state(tmp_path)
    write_sparse_model(folder, keys, rows(keys, 4))
    with TestClient(create_app(state)) as client:
        answer = client.post("/v1/models/demo/tables/t0/import", headers=AUTH,
                             data={"format": "sparse", "path": str(folder)})  # fmt: skip
        assert answer.status_code == 202, answer.text
        view = _ended(client, answer.json()["job"])
        assert view["state"] == "done", view
        got = client.post("/v1/models/demo/tables/t0/lookup", headers=AUTH,
                          json={"keys": keys[:2].tolist()}).json()  # fmt: skip
    assert [r["vector"] for r in got["results"]] == rows(keys[:2], 4).tolist()


@pytest.mark.parametrize(("dim", "rows_per_chunk"), [(1, 1 << 18), (4096, 512)])
def test_an_upload_is_read_in_chunks_of_bounded_bytes_and_rows(
    tmp_path: Path, dim: int, rows_per_chunk: int
) -> None:
    """Vectors of a control-plane import come a quarter of a command-line import's bytes at a
    time, and narrow ones no more rows at a time than any whole-table pass takes."""
    n = rows_per_chunk + 3
    keys = np.arange(n, dtype=np.int64)
    np.save(tmp_path / "keys.npy", keys)
    np.save(tmp_path / "vectors.npy", np.zeros((n, dim), np.float32))
    spec = TableSpec(model="m", table="t", dim=dim)
    src = uploads.source(tmp_path, "npy", spec)
    sizes = [k.size for k, _ in src.chunks()]
    assert sizes == [rows_per_chunk, 3]
    assert rows_per_chunk * dim * 4 <= uploads.UPLOAD_CHUNK_BYTES

"""Writes without reloads: imports, deletes and warm-ups reach both instances of a real
tritonserver through the node's change journal (no Kafka); a reload stays a reload.

Which instance answered is read from Triton's /metrics (every HPS series carries
``process="<instance>:<pid>"``); whether a reload happened, from the PIDs of the model's
Python stubs (a reload replaces every one).
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model
from tests.integration.service.conftest import Stack
from tests.integration.service.helpers import concurrent_rows, stub_pids

pytestmark = pytest.mark.integration

_SERIES = re.compile(r"^(hps_\w+)\{([^}]*)\} ([0-9.e+-]+)$")


def _per_process(stack: Stack, model: str) -> dict[tuple[str, str, str, str], float]:
    """(family, process, table, level) -> value of the model's HPS series in /metrics."""
    with urllib.request.urlopen(stack.server.metrics_url, timeout=5) as r:
        text = r.read().decode()
    out: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for line in text.splitlines():
        m = _SERIES.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != model:
            continue
        key = (m.group(1), labels["process"], labels.get("table", ""), labels.get("level", ""))
        out[key] += float(m.group(3))
    return out


def _requests(snap: dict[tuple[str, str, str, str], float]) -> dict[str, float]:
    return {p: v for (f, p, _, _), v in snap.items() if f == "hps_requests_total"}


def _served_by_both(stack: Stack, table: int, keys: np.ndarray, want: np.ndarray) -> dict:
    """Concurrent lookups until each of the two instances has answered some (hang guard);
    every answer must be ``want``. Returns the metrics before, to compare with."""
    before = _per_process(stack, "emb")
    deadline = time.monotonic() + 60
    while True:
        for rows in concurrent_rows(stack.server.http_url, "emb", 2, table, keys):
            np.testing.assert_allclose(rows, want)
        after = _requests(_per_process(stack, "emb"))
        grew = [p for p, v in after.items() if v > _requests(before).get(p, 0)]
        if len(grew) >= 2:
            return before
        assert time.monotonic() < deadline, f"one instance answered nothing: {after}"


def _wait_job(client: Any, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("done", "failed") or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_writes_reach_every_instance_without_a_reload(
    client: Any, stack: Stack, tmp_path: Path
) -> None:
    repo = stack.server.repository
    stubs = sorted(stub_pids(repo, "emb"))
    assert len(stubs) == 2, stubs
    keys, vectors = stack.data["emb.b"]
    changed = keys[20:30]
    _served_by_both(stack, 1, changed, vectors[20:30])  # resident in both L1s now

    # an import of changed rows (existing keys, new vectors)
    new = np.full((changed.size, 8), 7.5, np.float32)
    folder = stack.root / "imports" / "changed"
    write_sparse_model(folder, changed, new)
    files = {
        "keys": ("key", (folder / "key").read_bytes()),
        "vectors": ("emb_vector", (folder / "emb_vector").read_bytes()),
    }
    r = client.post("/v1/models/emb/tables/b/import", data={"format": "sparse"}, files=files)
    assert r.status_code == 202, r.text
    job = _wait_job(client, r.json()["job"])
    assert job["state"] == "done", job
    result = job["result"]
    assert result["via"] == "journal" and result["applied"] == 2 == result["instances"], result
    _served_by_both(stack, 1, changed, new)

    # a delete
    gone = keys[30:33]
    r = client.request("DELETE", "/v1/models/emb/tables/b/keys", json={"keys": gone.tolist()})
    assert r.status_code == 200, r.text
    assert r.json()["via"] == "journal" and r.json()["applied"] == 2, r.json()
    _served_by_both(stack, 1, gone, np.full((gone.size, 8), 0.5, np.float32))

    # a warm-up: afterwards every instance answers these keys from its L1
    a_keys, a_vectors = stack.data["emb.a"]
    warm = a_keys[200:210]
    r = client.post("/v1/models/emb/warmup", json={"keys": warm.tolist(), "table": "a"})
    assert r.status_code == 200, r.text
    assert r.json()["via"] == "journal" and r.json()["applied"] == 2, r.json()
    before = _served_by_both(stack, 0, warm, a_vectors[200:210])
    after = _per_process(stack, "emb")
    for process, answered in _requests(after).items():
        answered -= _requests(before).get(process, 0)
        delta = {
            level: after[("hps_hits_total", process, "a", level)]
            - before.get(("hps_hits_total", process, "a", level), 0)
            for level in ("l1", "l2", "l3", "default")
        }
        # L2: at most the warm-up's own 10 reads (sent with the process's next batch)
        l2 = delta.pop("l2")
        assert delta == {"l1": 10 * answered, "l3": 0, "default": 0} and l2 <= 10, (process, l2)

    assert sorted(stub_pids(repo, "emb")) == stubs, "a write reloaded the model"

    # tritonserver's memory stays flat over writes (a reload grows it by about 1 MB)
    assert stack.server.proc is not None
    server_pid = stack.server.proc.pid
    rss = [_rss_kib(server_pid)]
    for i in range(30):
        r = client.request("DELETE", "/v1/models/emb/tables/b/keys", json={"keys": [90_000 + i]})
        assert r.status_code == 200 and r.json()["applied"] == 2, r.text
        rss.append(_rss_kib(server_pid))
    print(f"tritonserver RSS over 30 deletes: {rss[0]} -> {rss[-1]} KiB")
    assert rss[-1] - rss[0] < 8 * 1024, rss
    assert sorted(stub_pids(repo, "emb")) == stubs

    # a configuration change is still a reload: every instance replaced
    r = client.post("/v1/models/emb/reload")
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60  # the old stubs exit after the new ones serve
    while set(stub_pids(repo, "emb")) & set(stubs) and time.monotonic() < deadline:
        time.sleep(0.2)
    replaced = sorted(stub_pids(repo, "emb"))
    assert len(replaced) == 2 and not set(replaced) & set(stubs), (stubs, replaced)
    _served_by_both(stack, 1, changed, new)  # the new instances read what was written

"""Model versions served by a real `hps serve` (2 instances; multi_process_hash_map L2, and
hash_map per instance for the cutover under load).

Every vector of version v of key k is ``[k, v, table, 0, ...]``, so a response shows which
version each of its rows came from. 8 clients read while version 2 is activated and
version 1 rolled back: no response mixes versions, each names the version it came from
(Triton's ``model_version``) and equals that version's vectors, none fails. A pinned
version answers while it is served. A crash of `hps serve` during an activation leaves the
recorded version live; a restarted `hps serve` comes back on the version recorded live.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from hps.loading.imports import repository_dir
from hps.net import free_port
from hps.triton.activation import activate
from hps.triton.admin_key import resolve_key
from hps.triton.client import ModelControl
from hps.triton.serving import serving_config
from hps.versions import VersionRegistry
from hps.versions.rollout import import_version, version_entry
from tests.fixtures.versions import write_encoded_version
from tests.helpers import wait_for_banner
from tests.integration.triton.test_serve_cli import run_hps
from tests.integration.triton.test_serve_lifecycle import serve, stop

pytestmark = pytest.mark.integration

ROWS, DIM, TABLES = 200, 16, ("C1", "C2")


def write_version(folder: Path, version: int) -> list[str]:
    """Both tables as version ``version`` encodes them; their folders."""
    return write_encoded_version(folder, version, rows=ROWS, dim=DIM, tables=TABLES)


@pytest.fixture(params=["multi_process_hash_map"])
def site(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A demo of 2 instances with L2 ``request.param`` (a test may parametrize it)."""
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", str(ROWS), "--instances", "2",
            cwd=tmp_path)  # fmt: skip
    ps = tmp_path / "demo" / "ps.json"
    doc = json.loads(ps.read_text())
    doc["volatile_db"]["type"] = request.param
    ps.write_text(json.dumps(doc))
    write_version(tmp_path / "demo" / "tables", 1)  # version 1: what ps.json names
    write_version(tmp_path / "v2", 2)
    (tmp_path / "tmp").mkdir()
    return tmp_path


class Readers:
    """8 threads asking for keys of both tables until stopped; every answer checked."""

    def __init__(self, url: str, threads: int = 8) -> None:
        self.url = url
        self.versions: Counter[str] = Counter()
        self.failures: list[str] = []
        self.mixed: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def __enter__(self) -> Readers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpclient.InferenceServerClient(self.url) as client:
            while not self._stop.is_set():
                keys = rng.integers(0, ROWS, 6)
                try:
                    version, rows = infer(client, keys)
                except Exception as exc:  # any failure is counted, none may happen
                    self.failures.append(repr(exc))
                    continue
                self.versions[version] += 1
                if not answered_by(rows, keys, int(version)):
                    self.mixed.append(f"{version}: {rows[:, :3].tolist()}")


def infer(
    client: httpclient.InferenceServerClient, keys: np.ndarray, version: str = ""
) -> tuple[str, np.ndarray]:
    """(the version that answered, rows[n, DIM]) for 3 keys of C1 then 3 of C2."""
    k = httpclient.InferInput("KEYS", [1, keys.size], "INT64")
    k.set_data_from_numpy(keys.reshape(1, -1).astype(np.int64))
    n = httpclient.InferInput("NUMKEYS", [1, 2], "INT32")
    n.set_data_from_numpy(np.array([[3, keys.size - 3]], np.int32))
    result = client.infer("demo", [k, n], model_version=version)
    rows = result.as_numpy("OUTPUT0").reshape(-1, DIM)
    return str(result.get_response()["model_version"]), rows


def answered_by(rows: np.ndarray, keys: np.ndarray, version: int) -> bool:
    table = np.repeat([0, 1], [3, keys.size - 3])
    want = np.zeros_like(rows)
    want[:, 0], want[:, 1], want[:, 2] = keys, version, table
    return bool(np.array_equal(rows, want))


def started(site: Path) -> tuple[subprocess.Popen[str], str]:
    http = free_port()
    proc = serve(site, http)
    wait_for_banner(proc, timeout=180)
    return proc, f"127.0.0.1:{http}"


def control(site: Path, url: str) -> ModelControl:
    return ModelControl(url, resolve_key(site / "demo"), timeout=120)


def served_version(url: str, version: str = "") -> str:
    with httpclient.InferenceServerClient(url) as client:
        got, rows = infer(client, np.arange(6), version)
    assert answered_by(rows, np.arange(6), int(got))
    return got


@pytest.mark.parametrize("site", ["hash_map", "multi_process_hash_map"], indirect=True)
def test_activation_and_rollback_under_load_never_mix_versions(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(site)
    config = serving_config("demo/ps.json")
    proc, url = started(site)
    try:
        import_version(config, version_entry(config, "demo", sparse_files=write_version(
            site / "v2", 2)), 2)  # fmt: skip
        assert served_version(url) == "1"  # imported beside: nothing served changed
        shutil.rmtree(site / "v2")  # an imported version needs its files no more
        with Readers(url) as readers:
            time.sleep(1)
            done = activate(config, "demo", 2, control(site, url), repository_dir(config))
            assert (done.live, done.previous, done.served) == (2, 1, [1, 2])
            assert served_version(url) == "2"
            assert served_version(url, "1") == "1"  # pinned: served while kept below live
            time.sleep(1)
            activate(config, "demo", 1, control(site, url), repository_dir(config))
            assert served_version(url) == "1"
            time.sleep(1)
        assert readers.failures == [] and readers.mixed == []
        assert readers.versions["1"] > 0 and readers.versions["2"] > 0, readers.versions
        assert VersionRegistry(config).live("demo") == 1
    finally:
        stop(proc)


def test_a_crash_during_activation_leaves_the_recorded_version_live(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(site)
    config = serving_config("demo/ps.json")
    import_version(config, version_entry(config, "demo", sparse_files=write_version(
        site / "v2", 2)), 2)  # fmt: skip
    proc, url = started(site)
    failed: list[BaseException] = []

    def activation() -> None:
        try:
            activate(config, "demo", 2, control(site, url), repository_dir(config))
        except BaseException as exc:
            failed.append(exc)

    policy = repository_dir(config) / "demo" / "config.pbtxt"  # type: ignore[operator]
    thread = threading.Thread(target=activation)
    try:
        thread.start()
        deadline = time.monotonic() + 30
        while "[ 1, 2 ]" not in policy.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # hps serve dies while Triton loads version 2
        proc.wait()
        thread.join()
    finally:
        stop(proc)
    assert failed and VersionRegistry(config).live("demo") == 1
    proc, url = started(site)
    try:
        assert served_version(url) == "1"  # one whole version: the one recorded live
        # and a completed activation is what the next start serves
        activate(config, "demo", 2, control(site, url), repository_dir(config))
    finally:
        stop(proc)
    proc, url = started(site)
    try:
        assert served_version(url) == "2"
    finally:
        stop(proc)


def test_bench_rollout_reports_the_cutover_of_both_steps() -> None:
    import argparse

    from hps.bench.rollout import run

    args = argparse.Namespace(tables=2, rows=500, instances=1, readers=2, settle=1.0)
    activation, rollback = list(run(args))
    assert (activation["step"], activation["to"], rollback["to"]) == ("activate", 2, 1)
    for row in (activation, rollback):
        assert row["failures"] == 0 and row["reads"] > 0
        assert row["first_new_s"] >= 0 and row["p99_cutover_ms"] > 0
        assert row["max_cutover_ms"] >= row["p99_cutover_ms"]


def test_a_failed_load_of_the_ctr_model_leaves_both_models_on_the_old_version(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 2's dense weights gone (its CTR instances cannot start): demo loads version
    2, demo_ctr fails to; the activation reloads demo with its old policy, so unversioned
    requests of both models still get version 1, as the record says, and version 2 can be
    retired."""
    from hps.errors import RequestError
    from hps.versions.rollout import retire

    monkeypatch.chdir(site)
    config = serving_config("demo/ps.json")
    import_version(config, version_entry(config, "demo", sparse_files=write_version(
        site / "v2", 2)), 2)  # fmt: skip
    dense = Path(VersionRegistry(config).model_at("demo", 2).dense_file)
    dense.write_bytes(b"not weights")  # the version's own copy
    proc, url = started(site)
    try:
        with pytest.raises(RequestError, match="load failed for model 'demo_ctr'"):
            activate(config, "demo", 2, control(site, url), repository_dir(config))
        assert served_version(url) == "1"
        triton = control(site, url)
        assert triton.version_states("demo").get(2) != "READY"
        assert {v for v, s in triton.version_states("demo").items() if s == "READY"} == {1}
        assert VersionRegistry(config).live("demo") == 1
        retire(config, "demo", 2)
        assert VersionRegistry(config).get("demo", 2).state == "retired"
    finally:
        stop(proc)

"""Version-tagged updates and models added at runtime, end to end: a real `hps serve`
(tritonserver), Tansu, Redis as the node's L2 (no L3, so imports and `hps consume` write it
side by side) and `hps consume` as a process; each serving instance's L1 listener refreshes
its own version's cache.

Every vector of version v of key k is ``[k, v, table, 0, ...]``. Version 2 is imported and
activated; an untagged update changes what the live version (2) answers and not what
version 1 does; one tagged for version 1 changes version 1 only (in Triton's answers and in
the rows `hps consume` wrote). A model added at runtime (without L1, so that what Triton
answers is what `hps consume` applied) gets its updates applied and served, also by a
restarted `hps consume`; once removed and purged it is no longer consumed and none of its
rows come back.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from hps.config import ModelConfig
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import repository_dir
from hps.net import free_port
from hps.testing.kafka import TansuBroker
from hps.tiers import Tiers
from hps.triton.activation import activate
from hps.triton.client import Client
from hps.triton.models import add_and_serve, remove
from hps.triton.serving import serving_config
from hps.types import TableSpec
from hps.updates import Publisher
from hps.versions.rollout import import_version, version_entry
from tests.fixtures.kafka import update_source_doc, wait_for
from tests.fixtures.versions import write_encoded_version
from tests.integration.triton.test_serve_lifecycle import serve, stop
from tests.integration.triton.test_versions import control
from tests.integration.updates.test_consume_process import ConsumeProcess

pytestmark = pytest.mark.integration

ROWS, DIM, TABLES = 100, 8, ("C1", "C2")


def write_version(folder: Path, version: int) -> list[str]:
    """Both tables as version ``version`` encodes them; their folders."""
    return write_encoded_version(folder, version, rows=ROWS, dim=DIM, tables=TABLES)


def expected(key: int, version: int) -> np.ndarray:
    """The imported rows of ``key`` in C1 and C2 of ``version``."""
    want = np.zeros((2, DIM), np.float32)
    want[:, 0], want[:, 1], want[:, 2] = key, version, [0, 1]
    return want


def write_site(site: Path, model: str, brokers: str, redis_address: str) -> None:
    doc = {
        "supportlonglong": True,
        "models": [{
            "model": model, "sparse_files": write_version(site / "demo" / "tables", 1),
            "embedding_table_names": list(TABLES), "embedding_vecsize_per_table": [DIM] * 2,
            "maxnum_catfeature_query_per_table_per_sample": [4, 4], "max_batch_size": 16,
            "gpucache": True, "hps_cache": {"capacity": 64},
        }],
        "volatile_db": {"type": "redis", "address": redis_address},
        "persistent_db": {"type": "disabled"},
        "update_source": update_source_doc(brokers, model),
    }  # fmt: skip
    (site / "demo" / "ps.json").write_text(json.dumps(doc))
    (site / "tmp").mkdir()


def rows(url: str, model: str, key: int, version: str = "") -> tuple[str, np.ndarray]:
    """(the version that answered, the rows of ``key`` in C1 and C2)."""
    k = httpclient.InferInput("KEYS", [1, 2], "INT64")
    k.set_data_from_numpy(np.array([[key, key]], np.int64))
    n = httpclient.InferInput("NUMKEYS", [1, 2], "INT32")
    n.set_data_from_numpy(np.array([[1, 1]], np.int32))
    with httpclient.InferenceServerClient(url) as client:
        result = client.infer(model, [k, n], model_version=version)
    got = result.as_numpy("OUTPUT0").reshape(2, DIM)
    return str(result.get_response()["model_version"]), got


def answers(url: str, model: str, key: int, want: np.ndarray, version: str = "") -> bool:
    return bool(np.array_equal(rows(url, model, key, version)[1], want))


def started(site: Path) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`hps serve` up to its banner; its output drained from then on."""
    http, err = free_port(), list[str]()
    proc = serve(site, http, err)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    lines: list[str] = []
    while "query --url" not in (lines[-1] if lines else ""):
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            pytest.fail("hps serve did not start:\n" + "".join(lines + err))
        lines.append(line)
    threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True).start()
    return proc, f"127.0.0.1:{http}", err


def extra_model(site: Path, name: str) -> ModelConfig:
    keys = np.arange(50, dtype=np.int64)
    write_sparse_model(site / name / "t", keys, np.full((50, 4), 7.0, np.float32))
    return ModelConfig.model_validate({
        "model": name, "sparse_files": [str(site / name / "t")],
        "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4],
        "gpucache": False,
    })  # fmt: skip


def x_row(client: Client, model: str, key: int) -> np.ndarray:
    return client.lookup(model, np.array([key]), np.array([1]))


def l2_rows(tiers: Tiers, spec: TableSpec, keys: list[int]) -> np.ndarray:
    """What the node's L2 holds for ``keys`` (NaN where nothing)."""
    assert tiers.volatile is not None
    tiers.volatile.open_table(spec)
    values, found = tiers.volatile.fetch(spec.name, np.array(keys, np.int64))
    out = np.asarray(values, dtype=np.float32).copy()
    out[~found] = np.nan
    return out


def logged(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text()


def test_versioned_and_runtime_model_updates_reach_triton(
    tmp_path: Path,
    kafka_broker: TansuBroker,
    redis_address: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site, model, extra = tmp_path, f"v{uuid.uuid4().hex[:8]}", f"x{uuid.uuid4().hex[:8]}"
    brokers = kafka_broker.bootstrap
    write_site(site, model, brokers, redis_address)
    monkeypatch.chdir(site)
    config = serving_config("demo/ps.json")
    repo = repository_dir(config)
    assert repo is not None
    proc, url, err = started(site)
    log = site / "consume.log"
    consume = ConsumeProcess(site / "demo" / "ps.json", log)
    l2 = Tiers.open(config, l2=True)
    (c1, c2), (c1v2, c2v2) = (config.model(model).at_version(n).tables for n in (1, 2))
    try:
        # version 2 imported beside version 1 and activated: both served, 2 live
        v2 = version_entry(config, model, sparse_files=write_version(site / "v2", 2))
        import_version(config, v2, 2)
        done = activate(config, model, 2, control(site, url), repo)
        assert (done.live, done.served) == (2, [1, 2])
        assert rows(url, model, 3)[0] == "2" and rows(url, model, 3, "1")[0] == "1"
        wait_for(lambda: logged(log, f"{model}: 1 ready, 2 live"), 60,
                 "hps consume to read the activation")  # fmt: skip

        # untagged: the live version 2 only (key 5 never asked of version 1 before)
        new = np.full((1, DIM), 50.0, np.float32)
        with Publisher(brokers) as pub:
            pub.publish(model, "C1", np.array([5]), new)
        want2 = expected(5, 2)
        want2[0] = new
        wait_for(lambda: answers(url, model, 5, want2), 60, "live version 2 to serve it")
        wait_for(lambda: np.array_equal(l2_rows(l2, c1v2, [5]), new), 60,
                 "hps consume to apply it to version 2")  # fmt: skip
        assert answers(url, model, 5, expected(5, 1), "1")
        np.testing.assert_array_equal(l2_rows(l2, c1, [5]), expected(5, 1)[:1])

        # tagged for version 1: version 1 only
        new1 = np.full((1, DIM), 61.0, np.float32)
        with Publisher(brokers, version=1) as pub:
            pub.publish(model, "C2", np.array([6]), new1)
        want1 = expected(6, 1)
        want1[1] = new1
        wait_for(lambda: answers(url, model, 6, want1, "1"), 60, "version 1 to serve it")
        wait_for(lambda: np.array_equal(l2_rows(l2, c2, [6]), new1), 60,
                 "hps consume to apply it to version 1")  # fmt: skip
        assert answers(url, model, 6, expected(6, 2))
        np.testing.assert_array_equal(l2_rows(l2, c2v2, [6]), expected(6, 2)[1:])

        # a model added at runtime: subscribed, its updates applied and served
        version, names = add_and_serve(config, extra_model(site, extra), control(site, url), repo)
        assert (version, names) == (1, [extra])
        before = np.full((1, 4), 7.0, np.float32)
        with Client(url) as client:
            np.testing.assert_array_equal(x_row(client, extra, 3), before)
            x_new = np.full((1, 4), 8.0, np.float32)
            with Publisher(brokers) as pub:
                pub.publish(extra, "t", np.array([4]), x_new)
            wait_for(lambda: np.array_equal(x_row(client, extra, 4), x_new), 60,
                     "the runtime model to serve its update")  # fmt: skip

            # a restarted hps consume starts with it (the models as served)
            assert consume.signal(signal.SIGTERM) == 0
            consume = ConsumeProcess(site / "demo" / "ps.json", log)
            x_newer = np.full((1, 4), 9.0, np.float32)
            with Publisher(brokers) as pub:
                pub.publish(extra, "t", np.array([4, 5]), np.concatenate([x_newer, x_newer]))
            wait_for(lambda: np.array_equal(x_row(client, extra, 5), x_newer), 60,
                     "the restarted consumer to apply the runtime model's update")  # fmt: skip

        # removed and purged: no longer consumed, none of its rows come back
        remove(config, extra, control(site, url), repo, purge_rows=True)
        wait_for(lambda: logged(log, f"left hps_et.{extra}.t"), 60, "hps consume to leave it")
        fence = np.full((1, DIM), 70.0, np.float32)
        with Publisher(brokers) as pub:
            pub.publish(extra, "t", np.array([6]), np.ones((1, 4), np.float32))
            pub.publish(model, "C1", np.array([7]), fence)
        want_fence = expected(7, 2)
        want_fence[0] = fence
        wait_for(lambda: answers(url, model, 7, want_fence), 60, "the update after it")
        store = redis.Redis.from_url(f"redis://{redis_address}")
        try:
            assert store.keys(f"*{extra}*") == []
        finally:
            store.close()
    finally:
        l2.close()
        if consume.proc.poll() is None:
            consume.signal(signal.SIGTERM)
        stop(proc)
    assert consume.proc.returncode == 0, log.read_text()[-3000:]

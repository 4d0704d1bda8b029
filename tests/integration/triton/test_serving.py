"""Several instances under concurrency, metrics in Triton's /metrics, reload of a model."""

from __future__ import annotations

import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model

pytestmark = pytest.mark.integration

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


def scrape(triton) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(triton.server.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def total(samples, name: str, **labels: str) -> float:
    return sum(
        v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())
    )


def test_64_concurrent_clients_against_2_instances(triton) -> None:
    a_keys, a_vecs = triton.data["emb.a"]
    c_keys, c_vecs = triton.data["emb.c"]

    def client_run(i: int) -> int:
        rng = np.random.default_rng(i)
        bad = 0
        with triton.client("grpc" if i % 2 else "http") as client:
            for _ in range(8):
                ia = rng.integers(0, a_keys.size, int(rng.integers(1, 60)))
                ic = rng.integers(0, c_keys.size, int(rng.integers(0, 30)))
                keys = np.concatenate([a_keys[ia], c_keys[ic]])
                out = client.lookup("emb", keys, [ia.size, 0, ic.size]).ravel()
                ref = np.concatenate([a_vecs[ia].ravel(), c_vecs[ic].ravel()])
                bad += not np.array_equal(out, ref)
        return bad

    with ThreadPoolExecutor(64) as pool:
        wrong = list(pool.map(client_run, range(64)))
    assert sum(wrong) == 0
    served = {
        lab["process"].split(":")[0]
        for n, lab, v in scrape(triton)
        if n == "hps_requests_total" and lab.get("model") == "emb" and v > 0
    }
    assert served == {"emb_0_0", "emb_0_1"}


def _every_instance_flushed(triton) -> None:
    """Requests until both instances of emb have sent their counters at least once (each
    sends what accumulated, its start-up's warm-up reads included, with its first request)."""
    deadline = time.monotonic() + 60  # a hang guard
    with triton.client("http") as client:
        while time.monotonic() < deadline:
            sent = {
                lab["process"].split(":")[0]
                for n, lab, v in scrape(triton)
                if n == "hps_requests_total" and lab.get("model") == "emb" and v > 0
            }
            if sent == {"emb_0_0", "emb_0_1"}:
                return
            client.lookup("emb", triton.data["emb.b"][0][:1], [0, 1, 0])
    raise AssertionError(f"instances that sent counters: {sent}")


def test_metrics_in_tritons_metrics_endpoint(triton) -> None:
    keys = np.concatenate([triton.data["emb.b"][0][:5], [7, 7]])  # 2 unknown, duplicated
    _every_instance_flushed(triton)  # their start-up counts (the warm-up) are out
    before = scrape(triton)
    with triton.client("http") as client:
        for _ in range(3):
            client.lookup("emb", keys, [0, 7, 0])
    after = scrape(triton)

    def delta(name: str, **labels: str) -> float:
        labels["model"] = "emb"
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("hps_requests_total") == 3
    assert delta("hps_lookups_total", table="b") == 3
    assert delta("hps_keys_total", table="b") == 21
    levels = ("l1", "l2", "l3", "default")
    hits = {lvl: delta("hps_hits_total", table="b", level=lvl) for lvl in levels}
    assert sum(hits.values()) == 3 * 6  # unique keys per lookup: 5 known + 1 unknown
    assert hits["default"] == 3
    assert delta("hps_lookup_latency_us_count") == 3
    assert delta("hps_lookup_latency_us_sum") > 0
    rates = [v for n, lab, v in after if n == "hps_hit_rate" and lab.get("table") == "b"]
    assert rates and all(0.0 <= r <= 1.0 for r in rates)
    assert total(after, "nv_inference_request_success", model="emb") > 0  # Triton's own
    # where each instance's L1 runs and why (hps.cache.auto): one series per process
    l1 = [(lab, v) for n, lab, v in after if n == "hps_l1_device" and lab.get("model") == "emb"]
    assert len({lab["process"] for lab, _ in l1}) == len(l1) == 2 and all(v == 1 for _, v in l1)
    assert all(lab["device"] in ("numpy", "cupy") for lab, _ in l1)
    assert all(lab["reason"] in ("no_gpu", "calibrated") for lab, _ in l1)  # device: auto


def test_errors_are_counted(triton) -> None:
    before = total(scrape(triton), "hps_request_errors_total", model="emb", code="INVALID_ARG")
    with triton.client("http") as client, pytest.raises(Exception, match="negative key count"):
        client.lookup("emb", [1, 2], [3, -1, 0])
    after = total(scrape(triton), "hps_request_errors_total", model="emb", code="INVALID_ARG")
    assert after - before == 1


def test_reload_picks_up_a_changed_table(triton) -> None:
    """Each reload through Triton's model-control API (explicit mode, with the admin key), as
    ``hps reload`` makes it, serves the retrained table: the second as well as the first.
    (A plain load of model files that did not change is one Triton skips.)"""
    from hps.triton.client import ModelControl

    control = ModelControl(triton.server.http_url, triton.server.admin_key)
    keys, vectors = triton.data["rel.r"]
    with triton.client("http") as client:
        before = client.lookup("rel", keys[:4], [4]).reshape(4, 4)
        np.testing.assert_array_equal(before, vectors[:4])
        for seed, extra in ((99, 10**12), (98, 2 * 10**12)):
            new_keys = np.concatenate([keys, [extra + 1, extra + 2]]).astype(np.int64)
            rng = np.random.default_rng(seed)
            new_vectors = rng.standard_normal((new_keys.size, 4), np.float32)
            write_sparse_model(triton.table_dir("rel", "r"), new_keys, new_vectors)
            control.reload("rel")
            assert client.client.is_model_ready("rel")
            probe = new_keys[[0, 1, -2, -1]]
            out = client.lookup("rel", probe, [4]).reshape(4, 4)
            np.testing.assert_array_equal(out, new_vectors[[0, 1, -2, -1]])
    triton.data["rel.r"] = (new_keys, new_vectors)

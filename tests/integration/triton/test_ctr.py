"""The example CTR model (lookup + dense network in one model) against a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from hps.errors import RequestError
from tests.fixtures.triton import CTR_DENSE, TABLES

pytestmark = pytest.mark.integration


def reference_scores(triton, dense, per_sample_keys) -> np.ndarray:
    """Written independently of hps.ctr.network: sum-pool per sample, ReLU MLP, sigmoid."""
    weights = np.load(triton.root / "ctr_dense.npz")
    layers = sum(1 for k in weights.files if k.startswith("w"))
    specs = triton.config.model("ctr").tables
    scores = []
    for s, sample_keys in enumerate(per_sample_keys):
        features = [dense[s]]
        for spec, keys in zip(specs, sample_keys, strict=True):
            known, vectors = triton.data[f"ctr.{spec.table}"]
            pooled = np.zeros(spec.dim, dtype=np.float64)
            for k in keys:
                hit = np.flatnonzero(known == k)
                pooled += vectors[hit[0]] if hit.size else spec.default_value
            features.append(pooled)
        x = np.concatenate(features)
        for i in range(layers):
            x = x @ weights[f"w{i}"].astype(np.float64) + weights[f"b{i}"]
            if i < layers - 1:
                x = np.maximum(x, 0.0)
        scores.append(1.0 / (1.0 + np.exp(-x[0])))
    return np.array(scores)


def make_request(triton, samples: int, seed: int):
    rng = np.random.default_rng(seed)
    per_sample = []
    for _ in range(samples):
        row = []
        for table, _, _ in TABLES["ctr"]:
            known = triton.data[f"ctr.{table}"][0]
            n = int(rng.integers(0, 4))
            keys = rng.choice(known, n).tolist()
            if n and rng.random() < 0.3:
                keys[0] = 10**15 + int(rng.integers(1000))  # unknown: the table default
            row.append(keys)
        per_sample.append(row)
    catcolumn, rowindex = [], []
    for t in range(len(TABLES["ctr"])):
        counts = [len(per_sample[s][t]) for s in range(samples)]
        rowindex += [0, *np.cumsum(counts).tolist()]
        catcolumn += [k for s in range(samples) for k in per_sample[s][t]]
    dense = rng.standard_normal((samples, CTR_DENSE)).astype(np.float32)
    return dense, np.array(catcolumn, dtype=np.int64), np.array(rowindex, np.int32), per_sample


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_scores_match_numpy_reference(triton, protocol) -> None:
    dense, catcolumn, rowindex, per_sample = make_request(triton, samples=9, seed=3)
    with triton.client(protocol) as client:
        scores = client.predict("ctr_ctr", dense, catcolumn, rowindex)
    assert scores.shape == (1, 9)
    ref = reference_scores(triton, dense, per_sample)
    np.testing.assert_allclose(scores[0], ref, rtol=1e-5, atol=1e-6)


def test_same_tables_through_the_hps_interface(triton) -> None:
    """ctr (HPS interface) and ctr_ctr (fused model) serve the same ps.json model."""
    keys = triton.data["ctr.y"][0][:3]
    with triton.client("http") as client:
        out = client.lookup("ctr", keys, [0, 3, 0])
    np.testing.assert_array_equal(out.reshape(3, 4), triton.data["ctr.y"][1][:3])


@pytest.mark.parametrize(
    "change,pattern",
    [
        ("rowindex", r"ShapeError: ROWINDEX has 10 offsets; expected tables \(3\)"),
        ("des", r"ShapeError: DES has 4 values; expected 2 samples x 5 dense features"),
        ("catcolumn", r"ShapeError: ROWINDEX accounts for \d+ keys but CATCOLUMN has \d+"),
        ("order", r"ShapeError: ROWINDEX offsets of each table must start at 0"),
    ],
    ids=["rowindex", "des", "catcolumn", "order"],
)
def test_bad_ctr_requests(triton, change, pattern) -> None:
    dense, catcolumn, rowindex, _ = make_request(triton, samples=2, seed=5)
    if change == "rowindex":
        rowindex = np.append(rowindex, 0).astype(np.int32)
    elif change == "des":
        dense = dense.ravel()[:4]
    elif change == "catcolumn":
        catcolumn = np.append(catcolumn, 1)
    else:
        rowindex = rowindex.copy()
        rowindex[0] = 1
    with triton.client("grpc") as client:
        with pytest.raises(RequestError, match=pattern):
            client.predict("ctr_ctr", dense, catcolumn, rowindex)
        good = make_request(triton, samples=2, seed=6)
        assert client.predict("ctr_ctr", *good[:3]).shape == (1, 2)

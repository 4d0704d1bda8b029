"""Exact vectors through a real tritonserver, over HTTP and gRPC, in HugeCTR's shapes."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.integration

PROTOCOLS = ["http", "grpc"]


def expected(triton, model: str, table: str, keys: np.ndarray) -> np.ndarray:
    """Reference vectors: the rows written to the sparse files, defaults for the others."""
    known, vectors = triton.data[f"{model}.{table}"]
    spec = next(t for t in triton.config.model(model).tables if t.table == table)
    out = np.full((keys.size, spec.dim), spec.default_value, dtype=np.float32)
    pos = {int(k): i for i, k in enumerate(known)}
    for i, k in enumerate(keys.tolist()):
        if k in pos:
            out[i] = vectors[pos[k]]
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_known_keys_exact_vectors(triton, protocol: str) -> None:
    keys = triton.data["emb.a"][0][[0, 5, 999, 17]]
    with triton.client(protocol) as client:
        out = client.lookup("emb", keys, [4, 0, 0])
    assert out.shape == (1, 4 * 4)
    np.testing.assert_array_equal(out.reshape(4, 4), expected(triton, "emb", "a", keys))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_keys_get_the_table_default(triton, protocol: str) -> None:
    known = triton.data["emb.b"][0]
    keys = np.array([known[3], 123456789, known[3], -1], dtype=np.int64)
    assert 123456789 not in set(known.tolist()) and -1 not in set(known.tolist())
    with triton.client(protocol) as client:
        out = client.lookup("emb", keys, [0, 4, 0]).reshape(4, 8)
    np.testing.assert_array_equal(out[[1, 3]], np.full((2, 8), -1.0, dtype=np.float32))
    np.testing.assert_array_equal(out[0], out[2])
    np.testing.assert_array_equal(out, expected(triton, "emb", "b", keys))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_table_request_in_table_order(triton, protocol: str) -> None:
    rng = np.random.default_rng(1)
    parts = {
        "a": rng.choice(triton.data["emb.a"][0], 7),
        "b": np.append(rng.choice(triton.data["emb.b"][0], 3), 42),
        "c": rng.choice(triton.data["emb.c"][0], 2),
    }
    keys = np.concatenate(list(parts.values()))
    with triton.client(protocol) as client:
        out = client.lookup("emb", keys, [7, 4, 2]).ravel()
    ref = np.concatenate([expected(triton, "emb", t, k).ravel() for t, k in parts.items()])
    assert out.size == 7 * 4 + 4 * 8 + 2 * 16
    np.testing.assert_array_equal(out, ref)


def test_hugectr_sample_client_shapes(triton) -> None:
    """HugeCTR's notebook client: tritonclient.http, KEYS [1, n], NUMKEYS [1, tables]."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    keys_a = triton.data["emb.a"][0][:20]
    keys_c = triton.data["emb.c"][0][:10]
    embedding_columns = np.array([list(keys_a) + list(keys_c)], dtype="int64")
    row_ptrs = np.array([[20, 0, 10]], dtype="int32")
    with httpclient.InferenceServerClient(triton.server.http_url) as client:
        inputs = [
            httpclient.InferInput(
                "KEYS", embedding_columns.shape, np_to_triton_dtype(embedding_columns.dtype)
            ),
            httpclient.InferInput("NUMKEYS", row_ptrs.shape, np_to_triton_dtype(row_ptrs.dtype)),
        ]
        inputs[0].set_data_from_numpy(embedding_columns)
        inputs[1].set_data_from_numpy(row_ptrs)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0")]
        response = client.infer("emb", inputs, request_id="1", outputs=outputs)
    out = response.as_numpy("OUTPUT0")
    assert out.shape == (1, 20 * 4 + 10 * 16)
    ref = np.concatenate(
        [expected(triton, "emb", "a", keys_a).ravel(), expected(triton, "emb", "c", keys_c).ravel()]
    )
    np.testing.assert_array_equal(out[0], ref)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_lookup_start_is_returned_only_when_asked_for(triton, protocol: str) -> None:
    import time

    keys = triton.data["emb.a"][0][:3]
    inputs = {"KEYS": keys[None], "NUMKEYS": np.array([[3, 0, 0]], dtype=np.int32)}
    with triton.client(protocol) as client:
        before = time.time_ns()
        out = client.infer_outputs("emb", inputs, ("OUTPUT0", "LOOKUP_START_NS"))
        after = time.time_ns()
        tensors = [client._input(k, v) for k, v in inputs.items()]
        only = [client.module.InferRequestedOutput("OUTPUT0")]
        plain = client.client.infer("emb", tensors, outputs=only)
    np.testing.assert_array_equal(out["OUTPUT0"].reshape(3, 4), expected(triton, "emb", "a", keys))
    stamp = out["LOOKUP_START_NS"]
    assert stamp.shape == (1, 1) and stamp.dtype == np.int64
    assert before <= int(stamp[0, 0]) <= after
    assert plain.as_numpy("LOOKUP_START_NS") is None  # not asked for: not sent


def test_batch_of_rows_is_one_lookup_per_row(triton) -> None:
    a = triton.data["emb.a"][0]
    keys = np.array([[a[0], a[1]], [a[2], a[3]]], dtype=np.int64)
    numkeys = np.array([[2, 0, 0], [2, 0, 0]], dtype=np.int32)
    with triton.client("grpc") as client:
        out = client.infer("emb", {"KEYS": keys, "NUMKEYS": numkeys})
    assert out.shape == (2, 8)
    np.testing.assert_array_equal(out[1].reshape(2, 4), expected(triton, "emb", "a", keys[1]))


def test_empty_request_gives_empty_output(triton) -> None:
    with triton.client("http") as client:
        out = client.lookup("emb", np.zeros(0, dtype=np.int64), [0, 0, 0])
    assert out.shape == (1, 0)

"""Bad requests get a Triton error of their own; other requests and the server go on."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hps.errors import RequestError, UnknownTableError

pytestmark = pytest.mark.integration

I64, I32 = np.int64, np.int32

# (label, inputs, message pattern): each is one bad request to model "emb" (tables a, b, c).
BAD = [
    (
        "keys dtype",
        {"KEYS": np.array([[1, 2]], I32), "NUMKEYS": np.array([[2, 0, 0]], I32)},
        "'KEYS' data-type is 'INT32', but model 'emb' expects 'INT64'",
    ),
    (
        "numkeys dtype",
        {"KEYS": np.array([[1, 2]], I64), "NUMKEYS": np.array([[2, 0, 0]], I64)},
        "'NUMKEYS' data-type is 'INT64', but model 'emb' expects 'INT32'",
    ),
    (
        "keys rank",
        {"KEYS": np.array([[[1], [2]]], I64), "NUMKEYS": np.array([[2, 0, 0]], I32)},
        "unexpected shape for input 'KEYS'",
    ),
    (
        "counts do not add up",
        {"KEYS": np.array([[1, 2, 3]], I64), "NUMKEYS": np.array([[2, 0, 0]], I32)},
        r"ShapeError: emb: key counts add up to 2 but 3 keys were sent",
    ),
    (
        "negative count",
        {"KEYS": np.array([[1, 2, 3]], I64), "NUMKEYS": np.array([[4, -1, 0]], I32)},
        r"ShapeError: emb: negative key count",
    ),
    (
        "too many keys",
        {"KEYS": np.arange(257, dtype=I64)[None], "NUMKEYS": np.array([[257, 0, 0]], I32)},
        r"BatchTooLargeError: emb.a: 257 keys exceed the limit of 256",
    ),
    (
        "one count per table",
        {"KEYS": np.array([[1, 2, 3]], I64), "NUMKEYS": np.array([[3]], I32)},
        r"ShapeError: emb: 1 key counts for 3 tables",
    ),
    (
        "batch sizes differ",
        {"KEYS": np.array([[1], [2]], I64), "NUMKEYS": np.array([[1, 0, 0]], I32)},
        "input 'KEYS' batch size does not match other inputs",
    ),
    (
        "missing input",
        {"KEYS": np.array([[1, 2]], I64)},
        r"missing required input\(s\) \['NUMKEYS'\]",
    ),
]


def good_request(triton) -> tuple[np.ndarray, np.ndarray]:
    keys = triton.data["emb.a"][0][:3]
    return keys, triton.data["emb.a"][1][:3]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("label,inputs,pattern", BAD, ids=[b[0] for b in BAD])
def test_bad_request_gets_clear_error(triton, protocol, label, inputs, pattern) -> None:
    keys, vectors = good_request(triton)
    with triton.client(protocol) as client:
        with pytest.raises(RequestError, match=pattern):
            client.infer("emb", inputs)
        out = client.lookup("emb", keys, [3, 0, 0])  # the server still serves
    np.testing.assert_array_equal(out.reshape(3, 4), vectors)


def test_error_codes_of_the_protocols(triton) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    bad = {"KEYS": np.array([[1, 2, 3]], I64), "NUMKEYS": np.array([[2, 0, 0]], I32)}
    statuses = []
    for module, url in ((httpclient, triton.server.http_url), (grpcclient, triton.server.grpc_url)):
        client = module.InferenceServerClient(url)
        inputs = []
        for name, array in bad.items():
            dtype = "INT64" if array.dtype == I64 else "INT32"
            tensor = module.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        with pytest.raises(InferenceServerException) as info:
            client.infer("emb", inputs)
        statuses.append(str(info.value.status()))
        client.close()
    assert statuses == ["400", "StatusCode.INVALID_ARGUMENT"]


def test_unknown_model(triton) -> None:
    with triton.client("grpc") as client, pytest.raises(UnknownTableError, match="nope"):
        client.lookup("nope", [1], [1])


def exec_and_requests(triton, model: str) -> tuple[float, float]:
    import urllib.request

    with urllib.request.urlopen(triton.server.metrics_url, timeout=10) as resp:
        text = resp.read().decode()

    def value(name: str) -> float:
        m = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("nv_inference_exec_count"), value("nv_inference_count")


def test_bad_requests_among_good_ones_in_the_same_batches(triton) -> None:
    """Model ``ctr`` batches concurrent requests into one execute() call (fixture)."""
    keys, vectors = triton.data["ctr.x"][0][:3], triton.data["ctr.x"][1][:3]
    bad = {"KEYS": np.array([[1, 2, 3]], I64), "NUMKEYS": np.array([[2, 0, 0]], I32)}
    execs0, count0 = exec_and_requests(triton, "ctr")

    def one(i: int) -> str:
        with triton.client("grpc") as client:
            if i % 3 == 0:
                try:
                    client.infer("ctr", bad)
                except RequestError as exc:
                    return "error" if "add up to 2 but 3" in str(exc) else "other error"
                return "no error"
            out = client.lookup("ctr", keys, [3, 0, 0])
            return "ok" if np.array_equal(out.reshape(3, 8), vectors) else "wrong"

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(one, range(48)))
    assert results.count("error") == 16
    assert results.count("ok") == 32
    deadline = time.monotonic() + 30  # hang guard: Triton counts just after answering
    while (counts := exec_and_requests(triton, "ctr"))[1] - count0 < 48:
        assert time.monotonic() < deadline, counts
        time.sleep(0.05)
    execs1, count1 = counts
    assert count1 - count0 == 48
    assert execs1 - execs0 < 48  # some execute() calls did get several requests

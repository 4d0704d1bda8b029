"""Triton's admin APIs are closed without the admin key, on HTTP and gRPC (docs/security.md,
rows 1-2).

Attack 1: a load call carrying a model.py of the attacker's (it would run in the server).
Attack 2: registering the Python stub's own shared-memory region, then pointing an output
at it (it aborted tritonserver). Both must be refused and leave the server serving.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from hps.triton.admin_key import ADMIN_HEADER, grpc_headers, http_headers
from hps.triton.supervisor.lifecycle import regions

pytestmark = pytest.mark.integration

EVIL_CONFIG = json.dumps({"backend": "python", "max_batch_size": 0, "input": [], "output": []})


def evil_model(marker: Path) -> bytes:
    return f"open({str(marker)!r}, 'w').write('pwned')\nclass TritonPythonModel: pass\n".encode()


def http(triton, method: str, path: str, body: object = None, key: str | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://{triton.server.http_url}{path}",
        data=data,
        method=method,
        headers=http_headers(key),
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def assert_serving(triton) -> None:
    keys, vectors = triton.data["emb.a"]
    with triton.client("grpc") as client:
        out = client.lookup("emb", keys[:5], [5, 0, 0]).reshape(5, 4)
    np.testing.assert_array_equal(out, vectors[:5])
    assert triton.server.is_ready()


def test_attack_1_loading_code_is_refused(triton, tmp_path: Path) -> None:
    import base64

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    marker = tmp_path / "pwned"
    code = evil_model(marker)
    body = {
        "parameters": {
            "config": EVIL_CONFIG,
            "file:1/model.py": base64.b64encode(code).decode(),
        }
    }
    status, text = http(triton, "POST", "/v2/repository/models/evil/load", body)
    assert status == 403 and f"expecting header '{ADMIN_HEADER}'" in text
    status, _ = http(triton, "POST", "/v2/repository/models/emb/load", {}, key="wrong-key")
    assert status == 403
    client = grpcclient.InferenceServerClient(triton.server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.load_model("evil", config=EVIL_CONFIG, files={"file:1/model.py": code})
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model("emb")
        with pytest.raises(InferenceServerException, match="restricted"):
            client.update_log_settings({"log_verbose_level": 1})
        with pytest.raises(InferenceServerException, match="restricted"):
            client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        index = client.get_model_repository_index(
            headers=grpc_headers(triton.server.admin_key), as_json=True
        )
    finally:
        client.close()
    assert "evil" not in {m["name"] for m in index["models"]}
    for path, body in [
        ("/v2/repository/models/emb/unload", {}),
        ("/v2/logging", {"log_verbose_level": 1}),
        ("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
        ("/v2/repository/index", {}),
    ]:
        assert http(triton, "POST", path, body)[0] == 403, path
    status, text = http(triton, "POST", "/v2/repository/index", {}, key=triton.server.admin_key)
    assert status == 200 and "emb" in text  # the key opens them
    assert not marker.exists()
    assert_serving(triton)


def test_attack_2_shared_memory_is_refused(triton) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    stub_region = regions(triton.server.shm_prefix)[0]  # the Python stub's own region
    body = {"key": f"/{stub_region.name}", "offset": 0, "byte_size": 4096}
    path = "/v2/systemsharedmemory/region/stub/register"
    assert http(triton, "POST", path, body)[0] == 403
    assert http(triton, "GET", "/v2/systemsharedmemory/status")[0] == 403
    assert http(triton, "POST", "/v2/cudasharedmemory/region/x/register", {})[0] == 403
    client = grpcclient.InferenceServerClient(triton.server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.register_system_shared_memory("stub", f"/{stub_region.name}", 4096)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_system_shared_memory_status()
    finally:
        client.close()
    import tritonclient.http as httpclient

    http_client = httpclient.InferenceServerClient(triton.server.http_url)
    try:  # the inference that aborted the server: its output sent to that region
        inputs = [httpclient.InferInput("KEYS", [1, 1], "INT64")]
        inputs[0].set_data_from_numpy(np.array([[1]], np.int64))
        inputs.append(httpclient.InferInput("NUMKEYS", [1, 3], "INT32"))
        inputs[1].set_data_from_numpy(np.array([[1, 0, 0]], np.int32))
        output = httpclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("stub", 4096)
        with pytest.raises(InferenceServerException, match="stub"):
            http_client.infer("emb", inputs, outputs=[output])
    finally:
        http_client.close()
    assert_serving(triton)
    assert stub_region.exists()


def test_what_stays_open(triton) -> None:
    """Inference, health, metadata, model configuration and statistics need no key."""
    for path in (
        "/v2/health/ready",
        "/v2/models/emb",
        "/v2/models/emb/config",
        "/v2/models/emb/stats",
    ):
        assert http(triton, "GET", path)[0] == 200, path

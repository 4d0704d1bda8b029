"""Unit tests of the control plane's small parts: token resolution, redaction, body limits,
its Triton view following a new admin key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from hps.errors import ConfigError
from hps.redact import REDACTED, redact_mapping
from hps.service.auth import check_bearer, resolve_token
from hps.service.limits import TokenAndBodyLimits, TooLarge


def test_token_sources_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPS_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("HPS_ADMIN_TOKEN_FILE", raising=False)
    assert resolve_token(None) is None
    env_file = tmp_path / "env-token"
    env_file.write_text("from-env-file-0123456789\n")
    monkeypatch.setenv("HPS_ADMIN_TOKEN_FILE", str(env_file))
    assert resolve_token(None) == "from-env-file-0123456789"
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "from-env-0123456789")
    assert resolve_token(None) == "from-env-0123456789"
    arg = tmp_path / "arg-token"
    arg.write_text(" from-arg-0123456789 ")
    assert resolve_token(str(arg)) == "from-arg-0123456789"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        resolve_token(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_token(str(tmp_path / "missing"))
    (tmp_path / "short").write_text("tok3n\n")
    with pytest.raises(ConfigError, match="short: 5 characters; .* at least 16") as err:
        resolve_token(str(tmp_path / "short"))
    assert "tok3n" not in str(err.value)
    (tmp_path / "binary").write_bytes(b"secret\xff\xfe")
    with pytest.raises(ConfigError, match=r"admin token file .*binary: not UTF-8") as err:
        resolve_token(str(tmp_path / "binary"))
    assert "secret" not in str(err.value)


def test_bearer_check() -> None:
    assert check_bearer(None, "Bearer x") == 403  # no token configured: refused, never open
    assert check_bearer("tok", None) == 401
    assert check_bearer("tok", "Basic tok") == 401
    assert check_bearer("tok", "Bearer tok2") == 401
    assert check_bearer("tok", "Bearer tok") is None
    assert check_bearer("tok", "bearer tok") is None


def test_config_route_redacts_by_name_pattern(tmp_path: Path) -> None:
    """GET /v1/config (no token needed) hides every secret-named setting (tests/unit/
    test_redact.py has the patterns)."""
    from hps.service.app import create_app
    from hps.service.state import AdminState
    from hps.service.triton_admin import TritonAdmin
    from tests.helpers import make_config

    kafka = {
        "ssl.keystore.password": "keystore-pass-1",
        "sasl.oauthbearer.config": "clientSecret=oauth-2",
        "sasl.password": "sasl-pass-3",
        "sasl.oauthbearer.assertion.private.key.passphrase": "passphrase-5",
        "acks": "all",
    }
    config = make_config(
        tmp_path,
        volatile_db={"type": "hash_map", "password": "redis-pass-4", "user_name": "u"},
        update_source={"type": "kafka", "hps_kafka_config": kafka},
    )
    state = AdminState(config, None, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "s")
    with TestClient(create_app(state)) as client:
        resp = client.get("/v1/config")
    assert resp.status_code == 200
    body = resp.json()
    assert body["volatile_db"]["password"] == REDACTED and body["volatile_db"]["user_name"] == "u"
    assert body["update_source"]["hps_kafka_config"] == {
        **{k: REDACTED for k in kafka if k != "acks"},
        "acks": "all",
    }
    assert not any(v in resp.text for v in [*kafka.values(), "redis-pass-4"] if v != "all")
    assert redact_mapping({"empty": {"password": ""}}) == {"empty": {"password": ""}}


def test_request_methods_a_client_makes_up_count_as_one_series(tmp_path: Path) -> None:
    from hps.service.app import create_app
    from hps.service.state import AdminState
    from hps.service.triton_admin import TritonAdmin
    from tests.helpers import make_config

    state = AdminState(make_config(tmp_path), None, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path)
    with TestClient(create_app(state)) as client:
        for method in ("PROBE0", "PROBE1", "PROBE2", "GET"):
            client.request(method, "/v1/config")
        text = client.get("/metrics").text
    assert "PROBE" not in text
    assert 'method="other"' in text and 'method="GET"' in text


def test_token_and_body_limits_refuse_before_reading_and_limit_bodies() -> None:
    inner = FastAPI()
    seen: list[int] = []

    @inner.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        body = await request.body()
        seen.append(len(body))
        return {"bytes": len(body)}

    @inner.post("/x/import")
    async def upload(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @inner.exception_handler(TooLarge)
    async def too_large(request: Request, exc: TooLarge) -> object:
        return JSONResponse({"error": "TooLarge"}, status_code=413)

    app = TokenAndBodyLimits(inner, token="tok", json_limit=100, upload_limit=1000)
    client = TestClient(app)
    auth = {"Authorization": "Bearer tok"}
    assert client.post("/echo", content=b"x" * 50).status_code == 401
    assert seen == []  # refused before the body was read
    assert client.post("/echo", content=b"x" * 50, headers=auth).json() == {"bytes": 50}
    assert client.post("/echo", content=b"x" * 101, headers=auth).status_code == 413

    def chunked() -> object:  # no Content-Length: counted while read
        yield b"x" * 80
        yield b"x" * 80

    assert client.post("/echo", content=chunked(), headers=auth).status_code == 413
    assert client.post("/x/import", content=b"x" * 900, headers=auth).json() == {"bytes": 900}
    assert client.post("/x/import", content=b"x" * 1001, headers=auth).status_code == 413
    assert client.get("/echo").status_code == 405  # reads need no token


def test_the_key_list_routes_limit_their_json_bodies_to_what_their_keys_take() -> None:
    """Refused (413, naming the limit) before the body is read or parsed; the most keys a
    route takes, written by a pretty-printer, fit."""
    import json

    from hps.service.limits import (
        LOOKUP_JSON_BYTES,
        MAX_JSON_BYTES,
        VERSION_JSON_BYTES,
        WRITE_KEYS_JSON_BYTES,
    )
    from hps.service.paths import MAX_PATH_CHARS
    from hps.service.schemas import MAX_LOOKUP_KEYS, MAX_PER_TABLE, MAX_WRITE_KEYS

    inner = FastAPI()
    seen: list[int] = []

    @inner.api_route("/v1/models/{m}/tables/{t}/lookup", methods=["POST"])
    @inner.api_route("/v1/models/{m}/tables/{t}/keys", methods=["DELETE"])
    @inner.api_route("/v1/models/{m}/warmup", methods=["POST"])
    @inner.api_route("/v1/models/{m}/versions", methods=["POST"])
    async def echo(request: Request) -> dict[str, int]:
        body = await request.body()
        seen.append(len(body))
        return {"bytes": len(body)}

    @inner.exception_handler(TooLarge)
    async def too_large(request: Request, exc: TooLarge) -> object:
        return JSONResponse({"error": "TooLarge", "detail": exc.detail}, status_code=413)

    client = TestClient(TokenAndBodyLimits(inner, token="tok"))
    auth = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
    lookup = "/v1/models/m/tables/t/lookup"
    most = json.dumps({"keys": [-(2**63)] * MAX_LOOKUP_KEYS}, indent=4).encode()
    assert len(most) < LOOKUP_JSON_BYTES
    assert client.post(lookup, content=most, headers=auth).json() == {"bytes": len(most)}
    r = client.post(lookup, content=b" " * (LOOKUP_JSON_BYTES + 1), headers=auth)
    assert r.status_code == 413 and seen == [len(most)]  # not read
    assert r.json()["detail"] == (
        "request body too large: this route takes at most 10,000 keys, its JSON body at most 1 MiB"
    )

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused once past the limit
        for _ in range(LOOKUP_JSON_BYTES // 65536 + 1):
            yield b" " * 65536

    r = client.post(lookup, content=chunked(), headers=auth)
    assert r.status_code == 413 and "its JSON body at most 1 MiB" in r.json()["detail"]

    most = json.dumps({"keys": [-(2**63)] * MAX_WRITE_KEYS}, indent=4).encode()
    assert len(most) < WRITE_KEYS_JSON_BYTES
    for method, path in (("DELETE", "/v1/models/m/tables/t/keys"), ("POST", "/v1/models/m/warmup")):
        r = client.request(method, path, content=most, headers=auth)
        assert r.json() == {"bytes": len(most)}, r.text
        big = {**auth, "Content-Length": str(WRITE_KEYS_JSON_BYTES + 1)}
        r = client.request(method, path, content=b"", headers=big)
        assert r.status_code == 413 and "at most 1,000,000 keys" in r.json()["detail"]
    # a model entry: 1 MiB (a list of millions of names took gigabytes to validate)
    big = {**auth, "Content-Length": str(1024**2 + 1)}
    r = client.post("/v1/models", content=b"", headers=big)
    assert r.status_code == 413 and "at most one model entry" in r.json()["detail"]
    # a version import: 5 MiB, its largest valid body fits (1,024 tables' longest paths)
    most = json.dumps({
        "version": 2**31 - 1, "sparse_files": ["/" * MAX_PATH_CHARS] * MAX_PER_TABLE,
        "dense_file": "/" * MAX_PATH_CHARS, "row_dtype": ["float32"] * MAX_PER_TABLE,
        "dims": [65536] * MAX_PER_TABLE,
    }, indent=4).encode()  # fmt: skip
    assert len(most) < VERSION_JSON_BYTES
    big = {**auth, "Content-Length": str(VERSION_JSON_BYTES + 1)}
    r = client.post("/v1/models/m/versions", content=b"", headers=big)
    assert r.status_code == 413 and "at most one version import" in r.json()["detail"]
    # other JSON bodies: the general limit
    big = {**auth, "Content-Length": str(MAX_JSON_BYTES + 1)}
    r = client.post("/v1/models/m/reload", content=b"", headers=big)
    assert r.json()["detail"] == "request body too large: a JSON body takes at most 64 MiB"
    # a control character in the path: the limits above follow the path, Starlette's route
    # patterns match before a final newline (/lookup%0A reached the lookup route, at 64 MiB)
    r = client.post(lookup + "%0A", content=b" " * (LOOKUP_JSON_BYTES + 1), headers=auth)
    assert r.status_code == 404 and "control character" in r.json()["detail"]
    assert len(seen) == 3  # none of these read


def test_triton_admin_follows_a_new_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hps serve writes a fresh key at every start: the control plane reads the current one."""
    from hps.service.triton_admin import TritonAdmin
    from hps.triton.admin_key import KEY_ENV, KEY_FILE_ENV, ensure_key, resolve_key

    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    first, _ = ensure_key(tmp_path)
    triton = TritonAdmin("127.0.0.1:1", admin_key=lambda: resolve_key(tmp_path))
    assert triton.admin_key == first
    second, _ = ensure_key(tmp_path)  # hps serve restarted
    assert triton.admin_key == second != first
    assert TritonAdmin("127.0.0.1:1", admin_key="fixed").admin_key == "fixed"


def test_import_of_values_a_float16_table_cannot_hold_is_a_400(tmp_path: Path) -> None:
    """Validated before anything is written (docs/config.md: hps_row_dtype)."""
    import numpy as np

    from hps.service.app import create_app
    from hps.service.state import AdminState
    from hps.service.triton_admin import TritonAdmin
    from tests.helpers import make_config

    config = make_config(
        tmp_path,
        models=[
            {
                "model": "demo",
                "embedding_table_names": ["h"],
                "embedding_vecsize_per_table": [4],
                "hps_row_dtype": "float16",
                "gpucache": False,
            }
        ],
    )
    state = AdminState(config, "tok", TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "s")
    keys = np.array([1, 2], dtype=np.int64).tobytes()
    vectors = np.array([[1, 2, 3, 4], [7e4, 0, 0, 0]], dtype=np.float32).tobytes()
    with TestClient(create_app(state)) as client:
        r = client.post(
            "/v1/models/demo/tables/h/import",
            data={"format": "sparse"},
            files={"keys": ("key", keys), "vectors": ("emb_vector", vectors)},
            headers={"Authorization": "Bearer tok"},
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "InvalidValueError"
    assert "demo.h: 1 value(s) outside float16's range" in r.json()["detail"]
    assert not (tmp_path / "rocksdb").exists()  # nothing written


def test_table_reports_share_one_read_of_triton_metrics(tmp_path: Path) -> None:
    """Reports within REPORT_MAX_AGE_S of each other share one read of Triton's /metrics
    (here refused: its reason is reported by each), and the next one reads again."""
    from hps.build import build_session
    from hps.service.app import create_app
    from hps.service.state import REPORT_MAX_AGE_S, AdminState
    from hps.service.triton_admin import TritonAdmin
    from tests.helpers import make_config

    config = make_config(tmp_path)
    build_session(config, with_cache=False).close()  # creates the L3 the reports read
    triton = TritonAdmin("127.0.0.1:1", metrics_url="http://127.0.0.1:1/metrics")
    state = AdminState(config, None, triton, state_dir=tmp_path / "s")
    assert state.metrics_reads.max_age_s == REPORT_MAX_AGE_S
    model = config.models[0]
    with TestClient(create_app(state)) as client:
        listed = client.get("/v1/models").json()
        table = client.get(f"/v1/models/{model.model}/tables/{model.tables[0].table}").json()
        assert state.metrics_reads.reads == 1
        assert "127.0.0.1:1" in listed["metrics_error"]
        assert table["hits"] == {} and table["model"] == model.model
        state.metrics_reads.max_age_s = 0.0
        client.get("/v1/models")
    assert state.metrics_reads.reads == 2

"""Unit tests of the control plane's small parts: token resolution, redaction, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from hps.errors import ConfigError
from hps.service.auth import check_bearer, resolve_token
from hps.service.limits import Gate, TooLarge
from hps.service.routes import REDACTED, redact
from hps.service.triton_admin import parse_hits


def test_token_sources_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPS_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("HPS_ADMIN_TOKEN_FILE", raising=False)
    assert resolve_token(None) is None
    env_file = tmp_path / "env-token"
    env_file.write_text("from-env-file\n")
    monkeypatch.setenv("HPS_ADMIN_TOKEN_FILE", str(env_file))
    assert resolve_token(None) == "from-env-file"
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "from-env")
    assert resolve_token(None) == "from-env"
    arg = tmp_path / "arg-token"
    arg.write_text(" from-arg ")
    assert resolve_token(str(arg)) == "from-arg"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        resolve_token(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_token(str(tmp_path / "missing"))


def test_bearer_check() -> None:
    assert check_bearer(None, "Bearer x") == 403  # no token configured: refused, never open
    assert check_bearer("tok", None) == 401
    assert check_bearer("tok", "Basic tok") == 401
    assert check_bearer("tok", "Bearer tok2") == 401
    assert check_bearer("tok", "Bearer tok") is None
    assert check_bearer("tok", "bearer tok") is None


def test_redact_hides_secrets_only() -> None:
    doc = {
        "volatile_db": {"password": "pw", "user_name": "u"},
        "update_source": {"hps_kafka_config": {"sasl.password": "x", "acks": "all"}},
        "empty": {"password": ""},
    }
    out = redact(doc)
    assert out["volatile_db"] == {"password": REDACTED, "user_name": "u"}
    assert out["update_source"]["hps_kafka_config"] == {"sasl.password": REDACTED, "acks": "all"}
    assert out["empty"] == {"password": ""}


def test_parse_hits_sums_processes() -> None:
    text = "\n".join(
        [
            "# HELP hps_hits_total x",
            'hps_hits_total{model="m",process="1:10",table="t",level="l1"} 3',
            'hps_hits_total{model="m",process="2:11",table="t",level="l1"} 4',
            'hps_hits_total{model="m",process="2:11",table="t",level="l2"} 1',
            'hps_keys_total{model="m",process="2:11",table="t"} 9',
        ]
    )
    assert parse_hits(text) == {("m", "t"): {"l1": 7.0, "l2": 1.0}}


def test_gate_refuses_before_reading_and_limits_bodies() -> None:
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

    app = Gate(inner, token="tok", json_limit=100, upload_limit=1000)
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

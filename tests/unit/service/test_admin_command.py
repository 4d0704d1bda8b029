"""``hps admin`` start-up: a busy port refused before any work, a missing token said."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hps.cli import main
from hps.net import free_port
from hps.service.commands import NO_TOKEN
from tests.unit.test_plan import ps_json


def test_a_busy_port_is_refused_before_the_app_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_start_up(*args: object, **kwargs: object) -> None:
        raise AssertionError("start-up ran")

    monkeypatch.setattr("hps.triton.serving.serving_config", no_start_up)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["admin", "--config", str(tmp_path / "ps.json"), "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2 and f"control-plane port {port} on 127.0.0.1 is in use" in err


def test_without_a_token_it_says_mutations_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    for name in ("HPS_ADMIN_TOKEN", "HPS_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)  # never started
    main(["admin", "--config", str(ps_json(tmp_path)), "--port", str(free_port())])
    assert NO_TOKEN in capsys.readouterr().err
    assert "403" in NO_TOKEN


@pytest.mark.parametrize("port", ["0", "99999"])
def test_the_port_is_a_tcp_port(capsys: pytest.CaptureFixture[str], port: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["admin", "--config", "ps.json", "--port", port])
    assert exc.value.code == 2
    assert f"argument --port: not a TCP port: {port}" in capsys.readouterr().err


def test_the_cli_defaults_are_those_of_the_limits() -> None:
    """The CLI keeps its own copies (it loads without the admin extra): they must agree."""
    from hps.service import commands, connections, jobs

    assert (commands.MAX_CONNECTIONS, commands.READ_TIMEOUT_S) == (
        connections.MAX_CONNECTIONS,
        connections.READ_TIMEOUT_S,
    )
    assert (commands.MAX_JOBS, commands.MAX_STAGED_BYTES) == (jobs.MAX_JOBS, jobs.MAX_STAGED_BYTES)


def test_the_triton_url_may_carry_its_scheme_and_nothing_else() -> None:
    from hps.errors import RequestError
    from hps.service.triton_admin import TritonAdmin

    admin = TritonAdmin("http://127.0.0.1:8000/")
    assert admin.url == "127.0.0.1:8000"
    assert admin.control.base == "http://127.0.0.1:8000"
    assert admin.metrics_url == "http://127.0.0.1:8002/metrics"
    with pytest.raises(RequestError, match="Triton address 'ftp://h:1'"):
        TritonAdmin("ftp://h:1")

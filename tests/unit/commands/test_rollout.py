"""``hps versions rollout``'s per-pod line: what the activation retired and what it left."""

from __future__ import annotations

import json
import urllib.request

import pytest

from hps.cli import main
from hps.commands.rollout import ControlPlane
from hps.types import JSON


def _pod(monkeypatch: pytest.MonkeyPatch, activated: JSON) -> None:
    """Every pod holds versions 1 (live) and 3; activating 3 answers ``activated``."""
    state = {"live": 1}

    def call(self: ControlPlane, method: str, path: str, body: JSON | None = None) -> JSON:
        if method == "POST" and path.endswith("/versions/3/activate"):
            state["live"] = 3
            return activated
        assert (method, path) == ("GET", "/v1/models/demo/versions"), (method, path)
        return {"live": state["live"], "versions": [{"version": 1}, {"version": 3}]}

    monkeypatch.setattr(ControlPlane, "call", call)


def test_the_line_names_what_was_retired_and_a_failed_drop_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pod(monkeypatch, {"previous": 1, "served": [1, 3], "retired": [2], "rows_left": [2],
                       "problem": "While lock file: rocksdb/LOCK"})  # fmt: skip
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "t" * 32)
    code = main(["versions", "rollout", "--model", "demo", "3", "--admin", "http://pod:8081"])
    out, err = capsys.readouterr()
    row = json.loads(out)
    assert code == 0 and row["ok"] and row["retired"] == [2] and row["rows_left"] == [2]
    assert "versions [2] of demo are retired but their rows are left" in err
    assert "While lock file" in err and "t" * 32 not in out + err


def test_a_clean_activation_says_nothing_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pod(monkeypatch, {"previous": 1, "served": [1, 3], "retired": [], "rows_left": [],
                       "problem": None})  # fmt: skip
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "t" * 32)
    code = main(["versions", "rollout", "--model", "demo", "3", "--admin", "http://pod:8081"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["retired"] == [] and err == ""


@pytest.mark.parametrize("url", ["notaurl", "ftp://pod:8081", "http://", "http://pod:port"])
def test_an_admin_that_is_not_an_http_url_is_a_usage_error(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "t" * 32)
    with pytest.raises(SystemExit) as exc:
        main(["versions", "rollout", "--model", "demo", "2", "--admin", url])
    assert exc.value.code == 2
    assert "--admin" in capsys.readouterr().err


def test_a_model_name_is_quoted_in_the_paths(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model name with a space or a slash reaches the pod as one path segment; an answer
    the pod cannot be reached with is a one-line error, not a traceback."""
    paths: list[str] = []

    def urlopen(req: urllib.request.Request, timeout: float) -> None:
        paths.append(req.selector)
        raise ValueError("no such path")

    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "t" * 32)
    code = main(["versions", "rollout", "--model", "de mo/x", "2", "--admin", "http://pod:8081"])
    out, err = capsys.readouterr()
    row = json.loads(out)
    assert code == 1 and not row["ok"] and "no such path" in row["error"]
    assert paths == ["/v1/models/de%20mo%2Fx/versions"]
    assert "Traceback" not in err


def test_the_hint_of_rows_left_names_the_requests_to_send(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pod(monkeypatch, {"previous": 1, "served": [1, 3], "retired": [2], "rows_left": [2],
                       "problem": "While lock file: rocksdb/LOCK"})  # fmt: skip
    monkeypatch.setenv("HPS_ADMIN_TOKEN", "t" * 32)
    main(["versions", "rollout", "--model", "demo", "3", "--admin", "http://pod:8081"])
    err = capsys.readouterr().err
    assert "DELETE /v1/models/demo/versions/2" in err and "{" not in err

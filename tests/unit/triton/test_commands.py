"""``hps demo``, ``hps serve`` and ``hps query``: options refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.cli import main
from hps.net import free_port


def hps(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--tables", "0"), ("--rows", "0"), ("--dim", "-3"), ("--dim", "0"), ("--instances", "0")],
)
def test_demo_sizes_are_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    code, err = hps(capsys, "demo", "--dir", str(tmp_path / "demo"), flag, value)
    assert code == 2 and f"argument {flag}: must be a positive integer" in err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http-port", "99999"], "argument --http-port: not a TCP port: 99999"),
        (["--metrics-port", "0"], "argument --metrics-port: not a TCP port: 0"),
        (["--max-request-mb", "-1"], "argument --max-request-mb: must be a finite number"),
        (["--metrics-interval", "-1"], "argument --metrics-interval: must be a finite number"),
    ],
)
def test_serve_refuses_numbers_out_of_range(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, err = hps(capsys, "serve", "--config", "ps.json", *args)
    assert code == 2 and message in err


def test_serve_refuses_a_port_given_twice_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = str(free_port())
    config = tmp_path / "ps.json"  # never read: the ports are checked first
    code, err = hps(capsys, "serve", "--config", str(config), "--http-port", port,
                    "--grpc-port", port, "--metrics-port", str(free_port()))  # fmt: skip
    assert code == 2 and f"the HTTP and gRPC ports are both {port}" in err


@pytest.mark.parametrize(
    ("inputs", "args", "message"),
    [
        (["DES", "CATCOLUMN", "ROWINDEX"], ["--keys", "1"], "--keys: m is a CTR model"),
        (["DES", "CATCOLUMN", "ROWINDEX"], ["--table", "C1"], "--table: m is a CTR model"),
        (["KEYS", "NUMKEYS"], ["--samples", "3"], "--samples: m is an embedding model"),
    ],
)
def test_query_refuses_options_the_model_would_ignore(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    inputs: list[str],
    args: list[str],
    message: str,
) -> None:
    monkeypatch.setattr("hps.triton.client.Client.input_names", lambda self, model: inputs)
    sent = []
    monkeypatch.setattr("hps.triton.client.query.query", lambda *a, **kw: sent.append(kw) or [])
    code, err = hps(capsys, "query", "--model", "m", *args)
    assert code == 2 and message in err and sent == []


def test_query_samples_are_positive(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = hps(capsys, "query", "--model", "m", "--samples", "0")
    assert code == 2 and "argument --samples: must be a positive integer, not 0" in err


def test_query_passes_the_options_the_model_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("hps.triton.client.Client.input_names", lambda self, m: ["KEYS", "NUMKEYS"])
    sent: list[dict[str, object]] = []
    monkeypatch.setattr("hps.triton.client.query.query", lambda *a, **kw: sent.append(kw) or [])
    assert hps(capsys, "query", "--model", "m", "--keys", "1,2", "--table", "C1") == (0, "")
    assert sent[0]["keys"] == "1,2" and sent[0]["table"] == "C1" and sent[0]["samples"] == 2


@pytest.mark.parametrize("key", ["99999999999999999999", "-9223372036854775809"])
def test_query_refuses_a_key_outside_int64_before_sending(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    monkeypatch.setattr("hps.triton.client.Client.input_names", lambda self, m: ["KEYS", "NUMKEYS"])
    monkeypatch.setattr("hps.triton.client.Client.served_config", lambda *a: pytest.fail("sent"))
    code, err = hps(capsys, "query", "--model", "m", "--keys", f"1,{key}")
    assert code == 2
    assert f"--keys: {key} is outside the int64 range" in err
    assert "-9223372036854775808 .. 9223372036854775807" in err


@pytest.mark.parametrize("keys", ["", ",", " , "])
def test_query_refuses_an_empty_key_list_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], keys: str
) -> None:
    monkeypatch.setattr("hps.triton.client.Client.input_names", lambda *a: pytest.fail("sent"))
    code, err = hps(capsys, "query", "--model", "m", "--keys", keys)
    assert code == 2
    assert err == f"hps query: error: --keys names no key ({keys!r}): give at least one, " \
                  "e.g. --keys 1,2,3\n"  # fmt: skip


@pytest.mark.parametrize(("keys", "item"), [("1,,2", 2), ("1,2,", 3), (",1", 1), ("1, ,2", 2)])
def test_query_refuses_an_empty_item_in_the_key_list_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], keys: str, item: int
) -> None:
    """A stray comma is a typo (a key left out?), not a key list to shorten silently."""
    monkeypatch.setattr("hps.triton.client.Client.input_names", lambda *a: pytest.fail("sent"))
    code, err = hps(capsys, "query", "--model", "m", "--keys", keys)
    assert code == 2
    assert err == f"hps query: error: --keys: item {item} of {keys!r} is empty: give " \
                  "comma-separated integers, e.g. --keys 1,2,3\n"  # fmt: skip


def test_serve_help_says_where_the_repository_goes(capsys: pytest.CaptureFixture[str]) -> None:
    """Beside L3 (hps.loading.imports.repository_dir), not a temporary folder."""
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps it
    assert "(default: <L3 path>.hps-repository beside L3;" in text
    assert "(default: temp)" not in text


def test_serve_refuses_a_host_tritonserver_cannot_bind(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = hps(capsys, "serve", "--config", "ps.json", "--host", "fe80::1%lo")
    assert code == 2 and "an IPv6 address with a zone cannot be served" in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--tables", "4097", "argument --tables: must be from 1 to 4096, not 4097"),
     ("--dim", "70000", "argument --dim: must be from 1 to 65536, not 70000")],
)  # fmt: skip
def test_demo_sizes_every_later_command_would_refuse_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    code, err = hps(capsys, "demo", "--dir", str(tmp_path / "demo"), flag, value)
    assert code == 2 and message in err
    assert not (tmp_path / "demo").exists()


def test_a_demo_whose_ps_json_would_be_refused_is_not_written(tmp_path: Path) -> None:
    """The ps.json is checked with the parser every later command uses, before any table
    is written."""
    from hps.ctr.demo import create_demo
    from hps.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^the demo's ps\.json would be refused: .*65536"):
        create_demo(tmp_path / "demo", num_tables=2, max_rows=10, dim=70_000)
    assert not (tmp_path / "demo").exists()

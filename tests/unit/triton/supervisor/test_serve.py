"""`hps serve`: its banner names the command that runs this very hps; a second one on the
same ps.json stops before it touches the first one's admin key; Ctrl-C stops it even when
it inherited SIGINT ignored, and a second Ctrl-C does not cut its drain short."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hps.cli import main
from hps.net import free_port
from hps.triton.admin_key import key_file_for
from hps.triton.supervisor import serve as serve_module
from hps.triton.supervisor.serve import _hps_command
from hps.triton.supervisor.serve_lock import hold_state_dir
from tests.unit.test_plan import ps_json


def test_banner_command_runs_this_hps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "venv" / "bin" / "hps"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _hps_command() == "venv/bin/hps"
    monkeypatch.setattr(sys, "argv", ["/somewhere/cli.py"])
    assert _hps_command() == f"{sys.executable} -m hps.cli"


def test_a_second_serve_of_a_ps_json_stops_before_it_writes_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ps_json(tmp_path)
    ports = [str(free_port()) for _ in range(3)]
    with hold_state_dir(tmp_path):  # what the first hps serve holds while it runs
        code = main(["serve", "--verbose", "--config", str(config), "--http-port", ports[0],
                     "--grpc-port", ports[1], "--metrics-port", ports[2]])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert f"another hps serve (pid {os.getpid()}) serves this ps.json" in err
    assert "use --state-dir" in err
    assert not key_file_for(tmp_path).exists()


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


class InterruptedServer:
    """A TritonServer stand-in: Ctrl-C arrives while it serves, and again, with SIGTERM,
    while it stops (a user pressing Ctrl-C twice, a supervisor sending SIGTERM)."""

    output = None
    load_models = ["m"]
    stopped = False

    def start(self) -> None:
        pass

    def wait(self) -> tuple[str, int]:
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("Ctrl-C did not interrupt the wait")

    def stop(self) -> list[str]:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)  # a handler that raises would have done so by now
        self.stopped = True
        return []


def test_a_second_ctrl_c_during_the_drain_does_not_cut_it(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], restore_signals: None
) -> None:
    monkeypatch.setattr(serve_module, "_print_banner", lambda *a: None)
    server = InterruptedServer()
    args = argparse.Namespace(watchdog_interval=0, config="ps.json")
    assert serve_module._run(server, None, args, None) == 0  # type: ignore[arg-type]
    assert server.stopped
    err = capfd.readouterr().err
    assert "stopping: draining requests, then tritonserver" in err
    assert err.count("already stopping") == 2, err


class HungUpServer(InterruptedServer):
    """The terminal closes while it serves (SIGHUP), and again while it stops."""

    def wait(self) -> tuple[str, int]:
        signal.raise_signal(signal.SIGHUP)
        raise AssertionError("SIGHUP did not interrupt the wait")

    def stop(self) -> list[str]:
        signal.raise_signal(signal.SIGHUP)
        time.sleep(0.01)
        self.stopped = True
        return []


def test_a_closed_terminal_drains_and_stops_as_ctrl_c_does(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], restore_signals: None
) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # not inherited ignored (nohup, CI)
    monkeypatch.setattr(serve_module, "_print_banner", lambda *a: None)
    server = HungUpServer()
    args = argparse.Namespace(watchdog_interval=0, config="ps.json")
    assert serve_module._run(server, None, args, None) == 0  # type: ignore[arg-type]
    assert server.stopped
    err = capfd.readouterr().err
    assert "stopping: draining requests" in err and err.count("already stopping") == 1


def test_under_nohup_a_hangup_stays_ignored(
    monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    monkeypatch.setattr(serve_module, "_print_banner", lambda *a: None)

    class Server(InterruptedServer):
        def wait(self) -> tuple[str, int]:
            signal.raise_signal(signal.SIGHUP)  # ignored: serving goes on
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            return "tritonserver", 0

        def stop(self) -> list[str]:
            self.stopped = True
            return []

    server = Server()
    args = argparse.Namespace(watchdog_interval=0, config="ps.json")
    assert serve_module._run(server, None, args, None) == 1  # Triton exited by itself
    assert server.stopped and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_ctrl_c_stops_a_serve_that_inherited_sigint_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restore_signals: None
) -> None:
    """A non-interactive shell starts `hps serve &` with SIGINT ignored; kill -INT (or
    Ctrl-C) must still stop it. Its handlers are the caller's again afterwards."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def interrupted(*_: object) -> None:
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.01)

    monkeypatch.setattr(serve_module, "check_ports", interrupted)
    args = argparse.Namespace(
        http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        host="127.0.0.1", config=str(tmp_path / "ps.json"),
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        serve_module.serve(args)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN

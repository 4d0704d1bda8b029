"""``hps bench freshness``: the two load-test runs it starts and what it reads back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hps.bench import BENCHES
from hps.bench.freshness import add_arguments, loadtest_command, reads


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_registered_and_both_runs_differ_only_in_updates(tmp_path: Path) -> None:
    assert BENCHES["freshness"] == "hps.bench.freshness"
    args = _args("--config", "d/ps.json", "--readers", "8", "--run-time", "30", "--l2", "redis")
    ro = loadtest_command(args, 0.0, tmp_path / "a")
    up = loadtest_command(args, 2000.0, tmp_path / "a")
    assert ro[ro.index("--updates") + 1] == "0" and up[up.index("--updates") + 1] == "2000"
    assert [x for x in ro if x != "0"] == [x for x in up if x != "2000"]
    for flag, value in (("--users", "8"), ("--run-time", "30"), ("--l2", "redis")):
        assert ro[ro.index(flag) + 1] == value


def test_reads_come_from_the_runs_stage(tmp_path: Path) -> None:
    stage = {"rps": 40.5, "p50_ms": 90.0, "p99_ms": 300.0, "failures": 0, "requests": 9}
    (tmp_path / "verdict.json").write_text(json.dumps({"stages": [stage]}))
    assert reads(tmp_path) == {"rps": 40.5, "p50_ms": 90.0, "p99_ms": 300.0, "failures": 0.0}
    assert reads(tmp_path / "missing")["rps"] == 0.0


def test_cores_of_both_runs_and_what_the_updates_took(tmp_path: Path) -> None:
    from hps.bench.freshness import _cpu

    ro, up = tmp_path / "ro", tmp_path / "up"
    runs = {ro: {"locust": 0.72, "stub demo": 0.2},
            up: {"locust": 0.63, "stub demo": 0.2, "broker (tansu)": 0.14}}  # fmt: skip
    for report, cores in runs.items():
        report.mkdir()
        (report / "cpu.json").write_text(json.dumps({"after_warmup_s": 12, "cores": cores}))
    got = _cpu(ro, up)
    assert got["read_only"]["locust"] == 0.72 and got["updates"]["broker (tansu)"] == 0.14
    assert got["updates_minus_read_only"] == {"locust": -0.09, "stub demo": 0.0,
                                              "broker (tansu)": 0.14}  # fmt: skip
    assert list(got["updates_minus_read_only"])[0] == "locust"  # what lost most comes first
    assert _cpu(ro, tmp_path / "missing") == {"read_only": got["read_only"], "updates": {}}


def test_the_line_gives_the_probes_after_the_warm_up_and_those_of_it_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hps.bench import freshness

    def fake_loadtest(cmd: list[str], out: object) -> int:
        report = Path(cmd[cmd.index("--report-dir") + 1])
        report.mkdir(parents=True)
        stage = {"rps": 100.0, "p50_ms": 50.0, "p99_ms": 120.0, "failures": 0, "requests": 9}
        (report / "verdict.json").write_text(json.dumps({"stages": [stage]}))
        types = {
            "kafka freshness": {"requests": 48, "failures": 0, "rps": 1.0,
                                "p50_ms": 90.0, "p95_ms": 150.0, "p99_ms": 200.0},
            "kafka freshness (warm-up)": {"requests": 12, "failures": 0, "rps": 1.0,
                                          "p50_ms": 100.0, "p95_ms": 400.0, "p99_ms": 520.0},
        }  # fmt: skip
        (report / "stats.json").write_text(json.dumps({"types": types, "errors": []}))
        return 0

    monkeypatch.setattr(freshness, "run_child", fake_loadtest)
    config = tmp_path / "ps.json"  # the runs are faked: never read
    config.write_text("{}")
    (line,) = freshness.run(_args("--config", str(config), "--report-dir", str(tmp_path)))
    assert line["freshness_p99_ms"] == 200.0 and line["probes"] == 48
    assert line["warmup_freshness_p99_ms"] == 520.0 and line["warmup_probes"] == 12
    assert line["read_rps_ratio"] == 1.0 and line["exit_codes"] == [0, 0]


def test_a_missing_config_is_named_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from hps.bench import freshness
    from hps.errors import ConfigError

    runs: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **_: runs.append(cmd))
    missing = str(tmp_path / "demo" / "ps.json")
    with pytest.raises(ConfigError, match=f"--config {missing}: no such file"):
        next(freshness.run(_args("--config", missing, "--report-dir", str(tmp_path))))
    assert runs == []


def test_a_failed_run_fails_the_bench_after_its_line_naming_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from hps.bench import freshness
    from hps.errors import HPSError

    def exits_2(cmd: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(cmd, 2)

    monkeypatch.setattr(subprocess, "run", exits_2)
    config = tmp_path / "ps.json"
    config.write_text("{}")
    lines = freshness.run(_args("--config", str(config), "--report-dir", str(tmp_path)))
    line = next(lines)
    assert line["exit_codes"] == [2, 2]
    with pytest.raises(HPSError) as failed:
        next(lines)
    message = str(failed.value)
    for label in ("read_only", "updates"):
        (out,) = tmp_path.glob(f"*-{label}.out")
        assert f"the {label} run exited with status 2 (its output: {out})" in message


CHILD = """
import signal, sys, time
from pathlib import Path

def stop(signum, frame):
    time.sleep(1)  # stopping its stack takes a while
    Path(sys.argv[2]).write_text("stack stopped")
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
Path(sys.argv[1]).write_text("started")
while True:
    time.sleep(0.1)
"""

MAIN = """
import sys
import hps.bench.freshness as bench
from hps.cli import main
bench.loadtest_command = lambda args, rate, report: [sys.executable, *sys.argv[2:5]]
sys.exit(main(["bench", "freshness", "--config", sys.argv[1], "--report-dir", sys.argv[5]]))
"""


def test_an_interrupted_bench_stops_its_load_test_and_waits_for_it(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "ps.json").write_text("{}")
    (tmp_path / "child.py").write_text(CHILD)
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    argv = [str(tmp_path / p) for p in ("ps.json", "child.py", "started", "stopped", "r")]
    proc = subprocess.Popen([sys.executable, "-c", MAIN, *argv], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 130
        assert stopped.read_text() == "stack stopped"  # written before the bench exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--l2", "redsi"], "argument --l2: invalid choice: 'redsi'"),
        (["--mix", "grpc=1,htp=2"], "unknown reader 'htp'"),
        (["--mix", "grpc=0"], "leaves no reader"),
    ],
)
def test_options_the_load_test_would_refuse_are_refused_first(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    from hps.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "freshness", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_load_tests_l2_types_are_the_benchs() -> None:
    from hps.bench.freshness import L2_TYPES
    from hps.cli import build_parser

    loadtest = build_parser()._subparsers._group_actions[0].choices["loadtest"]  # type: ignore[union-attr]
    l2 = next(a for a in loadtest._actions if a.dest == "l2")
    assert tuple(l2.choices) == L2_TYPES

"""``hps loadtest`` is registered, and Locust / gevent stay out of ``import hps`` and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hps.cli import main
from hps.errors import ConfigError
from hps.loadtest.runner import LocustRun, locust_command
from hps.loadtest.stack import effective_doc, needs_consumer


def test_import_hps_and_the_cli_do_not_load_locust() -> None:
    code = (
        "import sys, hps, hps.cli; hps.cli.build_parser(); import hps.loadtest.commands, "
        "hps.loadtest.workload, hps.loadtest.stack, hps.loadtest.runner; "
        "bad = [m for m in ('locust', 'gevent', 'grpc') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_lists_loadtest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["loadtest", "--help"])
    assert "--triton-grpc" in capsys.readouterr().out


def test_one_of_the_two_triton_addresses_is_an_error(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="both --triton-grpc and --triton-http"):
        from hps.cli import build_parser
        from hps.loadtest.commands import _loadtest

        _loadtest(build_parser().parse_args(
            ["loadtest", "--config", "ps.json", "--triton-grpc", "h:1",
             "--report-dir", str(tmp_path)]))  # fmt: skip


def test_locust_command_picks_the_users(tmp_path: object) -> None:
    run = LocustRun(config="ps.json", report_dir=tmp_path, triton_grpc="h:1", triton_http="h:2",
                    brokers="k:9", update_rows_per_s=0, admin_url="http://a:8081",
                    mix="grpc=1,http=0,ctr=2", threshold=("grpc lookup:p99_ms=5",))  # type: ignore[arg-type]  # fmt: skip
    cmd = locust_command(run)
    assert cmd[:5] == ["timeout", "-k", "20", "180", sys.executable]
    assert cmd[-3:] == ["CtrReader", "Prober", "AdminReader"] and "GrpcReader" in cmd
    assert "HttpReader" not in cmd and "Updater" not in cmd
    assert cmd[cmd.index("--threshold") + 1] == "grpc lookup:p99_ms=5"


def test_overrides_and_when_hps_consume_runs() -> None:
    doc = {"models": [{"model": "m", "embedding_vecsize_per_table": [4]}]}
    assert not needs_consumer(effective_doc(doc, l2=None, instances=None, updates=False))
    embedded = effective_doc(doc, l2=None, instances=None, updates=True)
    assert embedded["update_source"]["type"] == "kafka_message_queue"
    assert not needs_consumer(embedded)  # the single instance applies updates itself
    assert needs_consumer(effective_doc(doc, l2=None, instances=2, updates=True))
    cluster = effective_doc(doc, l2="redis_cluster", instances=None, updates=True)
    assert cluster["volatile_db"]["type"] == "redis_cluster" and needs_consumer(cluster)
    assert len(cluster["volatile_db"]["address"].split(",")) == 3
    assert "volatile_db" not in doc  # the caller's document is left alone


def test_the_stack_tells_its_l1s_through_the_journal_unless_told_otherwise() -> None:
    """One node, one hps consume writing its L2 and L3: one update stream for the node."""
    doc = {"models": [{"model": "m", "embedding_vecsize_per_table": [4]}]}
    shared = effective_doc(doc, l2="redis", instances=2, updates=True)
    assert shared["update_source"]["hps_l1_refresh"] == "journal"
    asked = effective_doc(doc, l2="redis", instances=2, updates=True, l1_refresh="listener")
    assert asked["update_source"]["hps_l1_refresh"] == "listener"
    own = {**doc, "update_source": {"type": "kafka_message_queue", "hps_l1_refresh": "listener"}}
    kept = effective_doc(own, l2=None, instances=2, updates=True)
    assert kept["update_source"]["hps_l1_refresh"] == "listener"  # the ps.json's choice
    assert "update_source" not in effective_doc(doc, l2=None, instances=2, updates=False)


class _Started(Exception):
    """Raised by the stand-in for start_stack: how it was called."""


def _start(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = []

    def start_stack(config: object, run_dir: object, **kw: object) -> None:
        calls.append(kw)
        raise _Started

    monkeypatch.setattr("hps.loadtest.stack.start_stack", start_stack)
    return calls


@pytest.mark.parametrize(
    ("updates", "kafka"), [(["--updates", "0"], True), (["--updates", "500"], True), ([], False)]
)
def test_an_explicit_updates_0_starts_kafka_without_bulk_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, updates: list[str], kafka: bool
) -> None:
    """hps bench freshness's read-only run: the broker and the prober as in its other run."""
    calls = _start(monkeypatch)
    with pytest.raises(_Started):
        main(["loadtest", "--config", "ps.json", "--report-dir", str(tmp_path), *updates])
    assert calls[0]["updates"] is kafka


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threshold", "grpc lookups:p99_ms=5"], "--threshold 'grpc lookups:p99_ms=5': "
         "unknown request type 'grpc lookups'"),
        (["--thresholds", "TYPO"], "unknown request type 'kafka  freshness'"),
        (["--mix", ""], "--mix '' leaves no reader"),
        (["--mix", "grpc=0,bad=0"], "leaves no reader"),
        (["--max-growth-mb", "10", "--triton-grpc", "h:1", "--triton-http", "h:2"],
         "--max-growth-mb samples the serving processes this command starts"),
        (["--max-growth-mb", "10", "--run-time", "20", "--warmup", "15"],
         "needs two memory samples after the warm-up"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    calls = _start(monkeypatch)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"grpc lookup": {"p99_ms": 1}, "kafka  freshness": {"p99_ms": 1}}))
    argv = [str(typo) if a == "TYPO" else a for a in argv]
    code = main(["loadtest", "--config", "ps.json", "--report-dir", str(tmp_path), *argv])
    assert code == 2 and calls == []
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run-time", "0"], "argument --run-time: must be a positive integer, not 0"),
        (["--run-time", "-5"], "argument --run-time: must be a positive integer, not -5"),
        (["--users", "0"], "argument --users: must be a positive integer, not 0"),
        (["--users", "-1"], "argument --users: must be a positive integer, not -1"),
        (["--spawn-rate", "0"], "argument --spawn-rate: must be a finite number above 0"),
        (["--spawn-rate", "nan"], "argument --spawn-rate: must be a finite number above 0"),
        (["--threshold", "*:max_fail_ratio=nan"], "max_fail_ratio must be a finite number"),
        (["--keys-per-sample", "0"], "argument --keys-per-sample: must be a positive integer"),
        (["--instances", "0"], "argument --instances: must be a positive integer, not 0"),
        (["--ramp-steps", "0"], "argument --ramp-steps: must be a positive integer, not 0"),
        (["--partitions", "0"], "argument --partitions: must be a positive integer, not 0"),
        (["--update-phases", "-1"], "argument --update-phases: must be 0 or more, not -1"),
        (["--update-batch-rows", "0"], "argument --update-batch-rows: must be a positive"),
        (["--warmup", "-1"], "argument --warmup: must be a finite number, 0 or more"),
        (["--sample-interval", "0"], "argument --sample-interval: must be a finite number"),
        (["--zipf", "-0.5"], "argument --zipf: must be a finite number, 0 or more"),
        (["--freshness-interval", "0"], "argument --freshness-interval: must be a finite"),
        (["--freshness-keys", "0"], "argument --freshness-keys: must be a positive integer"),
        (["--samples", "0"], "argument --samples: need 1 <= LO <= HI"),
        (["--samples", "9-3"], "argument --samples: need 1 <= LO <= HI"),
        (["--samples", "x"], "argument --samples: expected N or LO-HI"),
    ],
)
def test_load_options_out_of_range_are_refused_before_the_stack_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    calls = _start(monkeypatch)
    report = tmp_path / "report"
    try:
        code = main(["loadtest", "--config", "ps.json", "--report-dir", str(report), *argv])
    except SystemExit as exc:  # argparse's usage error
        code = exc.code  # type: ignore[assignment]
    assert code == 2 and calls == [] and not report.exists()  # nothing made, nothing started
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--samples", "4097"], "--samples 4097-4097 x 1 keys exceed demo's limit of 4096"),
        (["--keys-per-sample", "5"], "x 5 keys exceed demo's limit of 819 samples"),
        (["--samples", "8", "--model", "nope"], "--model nope: not in"),
    ],
)
def test_samples_beyond_the_models_limit_are_refused_before_the_stack_starts(
    demo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    calls = _start(monkeypatch)
    code = main(["loadtest", "--config", str(demo), "--report-dir", str(tmp_path), *argv])
    assert code == 2 and calls == []
    assert message in capsys.readouterr().err
    with pytest.raises(_Started):  # within the limit: the stack starts
        main(["loadtest", "--config", str(demo), "--report-dir", str(tmp_path),
              "--samples", "8-1024", "--keys-per-sample", "4"])  # fmt: skip


def test_locust_gets_the_probes_keys_and_timeout(tmp_path: Path) -> None:
    run = LocustRun(config=Path("ps.json"), report_dir=tmp_path, triton_grpc="h:1",
                    triton_http="h:2", freshness_keys=3, freshness_timeout_s=2.5)  # fmt: skip
    cmd = locust_command(run)
    assert cmd[cmd.index("--freshness-keys") + 1] == "3"
    assert cmd[cmd.index("--freshness-timeout") + 1] == "2.5"
    with pytest.raises(ConfigError, match="no reader of positive weight"):
        locust_command(LocustRun(Path("ps.json"), tmp_path, "h:1", "h:2", mix="grpc=0"))

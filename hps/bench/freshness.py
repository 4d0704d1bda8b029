"""Freshness under read load: ``hps loadtest`` twice on one ps.json, read-only then with updates.

Run 1: ``--updates 0``; run 2: ``--updates ROWS_PER_S``; both ``--readers`` readers for
``--run-time`` s with the same mix and shape, each on a stack of its own that ``hps
loadtest`` starts and stops. An explicit ``--updates``, 0 too, gives both stacks Kafka (a
ps.json without it gets the Tansu broker and, where the stack needs one, ``hps consume``)
and both runs the freshness prober: the runs differ only by the bulk update traffic.
One JSON line: freshness p50/p99 from the probes (``kafka freshness``: ``publish()`` to the
first lookup returning the new vectors; ``kafka visible``: ``publish()`` to when Triton began
serving them) and from the serving processes' ``hps_update_freshness_seconds``, with the
metric over ``visible`` (the same instant timed), all after the load test's warm-up (its first
20%; the warm-up's probes apart: ``warmup_*``); the readers' throughput and p99 with
updates, without, and their ratios (the aims: ``read_rps_ratio`` >= 0.9 and
``read_p99_ratio`` <= 1.2); failures and the exit codes of both runs; ``cpu_cores``: the
cores each process of the stack used after warm-up in both runs and the difference
(``updates_minus_read_only``: whose cores the update path took, the readers' included).
Reports stay in ``--report-dir``. A run that exits non-zero makes the bench fail after the
line (status 2), naming the file of that run's output.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hps.cli import non_negative_float, non_negative_int, positive_int
from hps.errors import ConfigError, HPSError
from hps.types import JSON

L2_TYPES = ("hash_map", "multi_process_hash_map", "redis", "redis_cluster")  # hps loadtest --l2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="demo/ps.json", help="ps.json (default: the demo)")
    parser.add_argument("--readers", type=positive_int, default=8, help="reader users")
    parser.add_argument(
        "--updates", type=non_negative_float, default=2000.0, help="update rows per second"
    )
    parser.add_argument("--run-time", type=positive_int, default=60, help="seconds per run")
    parser.add_argument("--mix", default="", help="reader mix (hps loadtest --mix)")
    parser.add_argument(
        "--l2", default="", choices=("", *L2_TYPES), help="hps loadtest --l2",
    )  # fmt: skip
    parser.add_argument(
        "--instances", type=non_negative_int, default=0, help="hps loadtest --instances"
    )
    parser.add_argument(
        "--l1-refresh", default="", choices=("", "listener", "journal"),
        help="hps loadtest --l1-refresh",
    )  # fmt: skip
    parser.add_argument("--report-dir", default="", help="folder of both runs' reports")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A reader mix ``hps loadtest`` would refuse, refused before the first run starts."""
    from hps.loadtest.options import reader_mix

    if args.mix:
        try:
            reader_mix(args.mix, ctr=True)
        except ConfigError as exc:
            parser.error(str(exc))


def loadtest_command(args: argparse.Namespace, updates: float, report: Path) -> list[str]:
    cmd = [
        sys.executable, "-m", "hps.cli", "loadtest", "--config", args.config,
        "--users", str(args.readers), "--spawn-rate", str(args.readers),
        "--run-time", str(args.run_time), "--updates", f"{updates:g}",
        "--report-dir", str(report), "--threshold", "*:max_fail_ratio=0",
    ]  # fmt: skip
    for flag, value in (("--mix", args.mix), ("--l2", args.l2), ("--l1-refresh", args.l1_refresh)):
        if value:
            cmd += [flag, value]
    if args.instances:
        cmd += ["--instances", str(args.instances)]
    return cmd


def run_child(cmd: list[str], out: IO[bytes]) -> int:
    """Run ``cmd`` (an ``hps loadtest``) to completion; its exit status.

    Interrupted (Ctrl-C, or SIGTERM under ``sigterm_interrupts``), this sends the child
    SIGTERM and waits until it has exited, further interrupts held back meanwhile: the load
    test stops the stack it started (broker, servers, Locust) before it exits."""
    from hps.loadtest.runner import interrupts_deferred

    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        return proc.wait()
    except BaseException:
        with interrupts_deferred():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait()
        raise


def _l1_refresh(report: Path) -> str | None:
    """How the run's serving L1s heard of updates (``Topology.l1_refresh`` of its ps.json:
    ``applier``, ``listener`` or ``journal``; None: no stack was started)."""
    from hps.config import parse_config
    from hps.errors import HPSError
    from hps.topology import topology

    path = report / "ps.json"
    try:
        return topology(parse_config(json.loads(path.read_text()), str(path))).l1_refresh
    except (OSError, ValueError, HPSError):
        return None


def reads(report: Path) -> dict[str, float]:
    """The readers' throughput and latency of a run (its one steady stage)."""
    from hps.loadtest.summary import read_report

    stages = read_report(report)["verdict"].get("stages") or []
    if not stages:
        return {"rps": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "failures": 0.0}
    s = stages[-1]
    return {k: float(s[k]) for k in ("rps", "p50_ms", "p99_ms", "failures")}


def run(args: argparse.Namespace) -> Iterator[JSON]:
    from hps.loadtest import freshness
    from hps.loadtest.summary import read_report

    if not Path(args.config).is_file():
        raise ConfigError(f"--config {args.config}: no such file (hps demo writes demo/ps.json)")
    base = Path(args.report_dir or tempfile.mkdtemp(prefix="hps-bench-freshness-"))
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = {}
    failed = []
    for label, rate in (("read_only", 0.0), ("updates", float(args.updates))):
        report, output = base / f"{stamp}-{label}", base / f"{stamp}-{label}.out"
        with open(output, "wb") as out:
            code = run_child(loadtest_command(args, rate, report), out)
        results[label] = (code, report)
        if code != 0:
            failed.append(f"the {label} run exited with status {code} (its output: {output})")
    (ro_code, ro_report), (up_code, up_report) = results["read_only"], results["updates"]
    ro, up = reads(ro_report), reads(up_report)
    up_stats = read_report(up_report)
    fresh = up_stats["freshness"]
    probes, visible, metric = fresh.probes, fresh.visible, fresh.metric
    warm = freshness.probes(up_stats["types"], freshness.PROBES + freshness.WARMUP)
    yield {
        "bench": "freshness",
        "config": args.config,
        "readers": args.readers,
        "update_rows_per_s": args.updates,
        "run_time_s": args.run_time,
        "l1_refresh": _l1_refresh(up_report),
        "freshness_p50_ms": probes.p50_ms if probes else None,
        "freshness_p99_ms": probes.p99_ms if probes else None,
        "probes": probes.count if probes else 0,
        "visible_p50_ms": visible.p50_ms if visible else None,
        "visible_p99_ms": visible.p99_ms if visible else None,
        "warmup_probes": warm.count if warm else 0,
        "warmup_freshness_p99_ms": warm.p99_ms if warm else None,
        "metric_freshness_p50_ms": metric.p50_ms if metric else None,
        "metric_freshness_p99_ms": metric.p99_ms if metric else None,
        "metric_messages": metric.count if metric else 0,
        "metric_vs_visible_p50": fresh.ratio("p50_ms"),
        "metric_vs_visible_p99": fresh.ratio("p99_ms"),
        "read_rps": up["rps"],
        "read_p99_ms": up["p99_ms"],
        "read_only_rps": ro["rps"],
        "read_only_p99_ms": ro["p99_ms"],
        "read_rps_ratio": round(up["rps"] / ro["rps"], 3) if ro["rps"] else None,
        "read_p99_ratio": round(up["p99_ms"] / ro["p99_ms"], 3) if ro["p99_ms"] else None,
        "read_failures": int(up["failures"] + ro["failures"]),
        "exit_codes": [ro_code, up_code],
        "stages": _stages(up_report),
        "cpu_cores": _cpu(ro_report, up_report),
        "reports": [str(ro_report), str(up_report)],
    }
    if failed:
        raise HPSError("; ".join(failed))


def _cpu(read_only: Path, updates: Path) -> dict[str, dict[str, float]]:
    """Cores per process role in both runs (``hps.loadtest.cpu``) and their difference."""
    import json

    from hps.loadtest.cpu import REPORT

    runs = {}
    for label, report in (("read_only", read_only), ("updates", updates)):
        path = report / REPORT
        runs[label] = json.loads(path.read_text())["cores"] if path.exists() else {}
    ro, up = runs["read_only"], runs["updates"]
    if ro and up:
        diff = {r: round(up.get(r, 0.0) - ro.get(r, 0.0), 3) for r in {*ro, *up}}
        runs["updates_minus_read_only"] = dict(sorted(diff.items(), key=lambda kv: kv[1]))
    return runs


def _stages(report: Path) -> dict[str, object]:
    """The run's stage figures where the serving processes apply updates themselves."""
    import json

    from hps.loadtest.freshness import REPORT

    path = report / REPORT
    if not path.exists():
        return {}
    stages = json.loads(path.read_text()).get("stages")
    return stages if isinstance(stages, dict) else {}

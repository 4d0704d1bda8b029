"""Run Locust headless in a process of its own, under ``timeout``, with the HPS options.

Locust patches the standard library for gevent on import, so it never runs inside the
``hps`` process: :func:`locust_command` builds the command line, :func:`run_locust` runs it
with its output in ``locust.log`` of the report folder. Reports: Locust's
``locust_stats.csv``, ``locust_stats_history.csv``, ``locust_failures.csv``,
``locust_exceptions.csv`` (rewritten once a second while it runs: the last second may be
missing) and ``report.html``; from the locustfile, when Locust quits, ``stats.json`` (the
final statistics), ``stages.csv`` and ``verdict.json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
CLASSES = {
    "grpc": "GrpcReader",
    "http": "HttpReader",
    "ctr": "CtrReader",
    "bad": "BadRequester",
    "updates": "Updater",
    "freshness": "Prober",
    "admin": "AdminReader",
}


@dataclass(frozen=True)
class LocustRun:
    """What to run: the deployment's addresses and the workload's knobs."""

    config: Path
    report_dir: Path
    triton_grpc: str
    triton_http: str
    users: int = 8
    spawn_rate: float = 8.0
    run_time_s: int = 60
    shape: str = "steady"
    ramp_steps: int = 8
    model: str = ""
    admin_url: str = ""
    brokers: str = ""
    update_rows_per_s: float = 0.0
    update_batch_rows: int = 500
    update_phases: int = 0
    freshness_interval: float = 1.0
    freshness_keys: int = 8
    freshness_timeout_s: float = 10.0
    freshness_warmup_s: float = 0.0
    mix: str = "grpc=4,http=2,ctr=1,bad=1"
    zipf: float = 1.1
    samples: str = ""
    keys_per_sample: int = 1
    verify_keys: int = 4
    thresholds: str = ""
    threshold: tuple[str, ...] = ()
    seed: int = 0

    def user_classes(self) -> list[str]:
        """The Locust user classes to run; a mix without a reader is refused (given no
        class, Locust would run every one of the locustfile)."""
        from hps.errors import ConfigError
        from hps.loadtest.options import weights

        kinds = [k for k, w in weights(self.mix).items() if w > 0]
        if not kinds:
            raise ConfigError(f"--mix {self.mix!r}: no reader of positive weight")
        if self.brokers:
            kinds.append("freshness")
            if self.update_rows_per_s > 0:
                kinds.append("updates")
        if self.admin_url:
            kinds.append("admin")
        return [CLASSES[k] for k in kinds]


def locust_command(run: LocustRun, grace_s: int = 120) -> list[str]:
    prefix = run.report_dir / "locust"
    cmd = [
        "timeout", "-k", "20", str(run.run_time_s + grace_s),
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(run.users), "-r", str(run.spawn_rate), "-t", f"{run.run_time_s}s",
        "--stop-timeout", "10", "--only-summary", "--csv", str(prefix), "--csv-full-history",
        "--html", str(run.report_dir / "report.html"), "--loglevel", "WARNING",
        "--hps-config", str(run.config), "--hps-report-dir", str(run.report_dir),
        "--triton-grpc", run.triton_grpc, "--triton-http", run.triton_http,
        "--hps-shape", run.shape, "--ramp-steps", str(run.ramp_steps),
        "--zipf", str(run.zipf), "--keys-per-sample", str(run.keys_per_sample),
        "--verify-keys", str(run.verify_keys), "--mix", run.mix,
        "--update-rows-per-s", str(run.update_rows_per_s),
        "--update-batch-rows", str(run.update_batch_rows),
        "--update-phases", str(run.update_phases),
        "--freshness-interval", str(run.freshness_interval),
        "--freshness-keys", str(run.freshness_keys),
        "--freshness-timeout", str(run.freshness_timeout_s),
        "--freshness-warmup", str(run.freshness_warmup_s), "--hps-seed", str(run.seed),
    ]  # fmt: skip
    for flag, value in (
        ("--hps-model", run.model),
        ("--admin-url", run.admin_url),
        ("--brokers", run.brokers),
        ("--samples", run.samples),
        ("--thresholds", run.thresholds),
    ):
        if value:
            cmd += [flag, value]
    for spec in run.threshold:
        cmd += ["--threshold", spec]
    return cmd + run.user_classes()


def run_locust(run: LocustRun) -> int:
    """Run Locust to completion; its exit code (0: passed; 1: a threshold broken or an
    exception in a user, 2: an unhandled greenlet exception, see ``verdict.json``; 124:
    timed out).

    Locust and ``timeout`` run in a process group of their own: if this process is
    interrupted, the whole group is stopped (killing ``timeout`` alone would leave Locust
    hammering the stopped stack).
    """
    run.report_dir.mkdir(parents=True, exist_ok=True)
    with open(run.report_dir / "locust.log", "ab") as out:
        proc = subprocess.Popen(
            locust_command(run), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait()
        except BaseException:
            stop_group(proc)
            raise


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace_s``; Ctrl-C or SIGTERM
    meanwhile is held back until the group is gone (:func:`interrupts_deferred`)."""
    with interrupts_deferred():
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(grace_s)
                return
            except subprocess.TimeoutExpired:
                continue


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back SIGINT and SIGTERM while the block runs, then deliver them.

    For clean-up that must finish: a second Ctrl-C while processes are being stopped would
    otherwise cut the clean-up short and leave the rest running. A signal that arrives
    meanwhile is logged and raised again once the block is done, to the handler that was
    there before (``KeyboardInterrupt`` for Ctrl-C). A no-op outside the main thread, where
    no signal handler runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum not in held:
            held.append(signum)
        log.warning("%s held back until what was started is stopped", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in held:
            signal.raise_signal(signum)

"""A model rollout under read load: activate version 2, then roll back to version 1.

Writes a demo (``--tables``, ``--rows``, ``--instances``) in a temporary folder, imports
version 2 beside it (the demo's vectors + 1), starts ``hps serve`` and ``--readers`` HPS
lookup clients, reads ``--settle`` s, activates version 2, reads ``--settle`` s, rolls back
to version 1, reads ``--settle`` s. One JSON line per step: how long the activation took,
the time from its start to the first response of the new version and to the last response
of the old one, the readers' p99 during the cutover against the ``--settle`` s before it
(``p99_ratio``), the slowest request during the cutover, and failed requests. Version 1's
import and start-up are not timed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hps.cli import positive_float, positive_int
from hps.types import JSON


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", type=positive_int, default=26, help="demo tables")
    parser.add_argument(
        "--rows", type=positive_int, default=100_000, help="rows of the largest table"
    )
    parser.add_argument("--instances", type=positive_int, default=2, help="Triton instances")
    parser.add_argument("--readers", type=positive_int, default=8, help="reader threads")
    parser.add_argument(
        "--settle", type=positive_float, default=5.0, help="seconds read between steps"
    )


@dataclass
class Reads:
    """(start, end, version, ok) of every request, appended by the reader threads."""

    log: list[tuple[float, float, str, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def latencies(self, lo: float, hi: float) -> list[float]:
        """Seconds of the requests in flight at some time in [lo, hi)."""
        return [e - s for s, e, _, ok in self.log if ok and s < hi and e > lo]

    def p99_ms(self, lo: float, hi: float) -> float:
        """p99 of the requests in flight at some time in [lo, hi)."""
        lat = self.latencies(lo, hi)
        return float(np.percentile(lat, 99) * 1e3) if lat else 0.0


def _reader(url: str, tables: int, reads: Reads, seed: int) -> None:
    import tritonclient.http as httpclient

    rng = np.random.default_rng(seed)
    with httpclient.InferenceServerClient(url) as client:
        while not reads.stop.is_set():
            keys = rng.integers(0, 1000, tables).astype(np.int64).reshape(1, -1)
            k = httpclient.InferInput("KEYS", list(keys.shape), "INT64")
            k.set_data_from_numpy(keys)
            n = httpclient.InferInput("NUMKEYS", [1, tables], "INT32")
            n.set_data_from_numpy(np.ones((1, tables), np.int32))
            start = time.perf_counter()
            try:
                result = client.infer("demo", [k, n])
                version, ok = str(result.get_response()["model_version"]), True
            except Exception:  # a failed request is counted, whatever the client raised
                version, ok = "", False
            reads.log.append((start, time.perf_counter(), version, ok))


def _serve(ps: Path, http: int) -> subprocess.Popen[str]:
    from hps.net import free_port

    cmd = [
        sys.executable, "-m", "hps.cli", "serve", "--config", str(ps), "--http-port", str(http),
        "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
    ]  # fmt: skip
    return _until_ready(cmd, ps.parent, "hps serve")


def _until_ready(cmd: list[str], cwd: Path, what: str) -> subprocess.Popen[str]:
    """Start ``cmd`` in a process group of its own and wait for its ``ready:`` line.

    Its own group: a terminal's Ctrl-C is this bench's, which stops it (:func:`_stop`) once
    the readers are done, and a server that ignores SIGTERM is killed with its children. If
    it never gets ready, or this process is interrupted meanwhile, it is stopped here."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("ready:"):
                threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
                return proc
    except BaseException:
        _stop(proc)
        raise
    _stop(proc)
    raise RuntimeError(f"{what} exited ({proc.returncode}) before it was ready")


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the group of ``hps serve`` (it drains, then stops Triton), SIGKILL it after
    a minute; a Ctrl-C or SIGTERM meanwhile waits until it is done."""
    from hps.loadtest.runner import stop_group

    stop_group(proc, grace_s=60)


def _step(reads: Reads, name: str, old: str, new: str, t0: float, t1: float, settle: float) -> JSON:
    after = [(e, v) for s, e, v, ok in reads.log if ok and s >= t0]
    first_new = min((e for e, v in after if v == new), default=t1)
    last_old = max((e for e, v in after if v == old), default=t0)
    cut_end = max(t1, last_old, first_new)
    before, during = reads.p99_ms(t0 - settle, t0), reads.p99_ms(t0, cut_end)
    return {
        "bench": "rollout",
        "step": name,
        "from": int(old),
        "to": int(new),
        "activate_s": round(t1 - t0, 3),
        "first_new_s": round(first_new - t0, 3),
        "last_old_s": round(last_old - t0, 3),
        "p99_before_ms": round(before, 2),
        "p99_cutover_ms": round(during, 2),
        "p99_ratio": round(during / before, 3) if before else None,
        "max_cutover_ms": round(max(reads.latencies(t0, cut_end), default=0.0) * 1e3, 2),
        "reads": len([1 for s, _, _, _ in reads.log if t0 - settle <= s < cut_end]),
        "failures": sum(1 for s, _, _, ok in reads.log if not ok and s >= t0 - settle),
    }


def run(args: argparse.Namespace) -> Iterator[JSON]:
    from hps.ctr.demo import create_demo
    from hps.io.sparse_model import read_sparse_model, write_sparse_model
    from hps.loading.imports import repository_dir
    from hps.net import free_port
    from hps.triton.activation import activate
    from hps.triton.admin_key import resolve_key
    from hps.triton.client import ModelControl
    from hps.triton.serving import serving_config
    from hps.versions.rollout import import_version, version_entry

    with tempfile.TemporaryDirectory(prefix="hps-bench-rollout-") as tmp:
        ps = create_demo(Path(tmp) / "demo", num_tables=args.tables, max_rows=args.rows,
                         instances=args.instances)  # fmt: skip
        config = serving_config(ps)
        model = config.model("demo")
        files = []
        for spec, path in zip(model.tables, model.sparse_files, strict=True):
            dest = Path(tmp) / "v2" / spec.table
            for keys, vectors in read_sparse_model(path, spec.dim):
                write_sparse_model(dest, keys, vectors + 1.0)
            files.append(str(dest))
        http = free_port()
        proc = _serve(ps, http)  # stopped by _serve if it does not get ready
        try:
            import_version(config, version_entry(config, "demo", sparse_files=files), 2)
            control = ModelControl(f"127.0.0.1:{http}", resolve_key(ps.parent), timeout=600)
            repo = repository_dir(config)
            assert repo is not None  # the demo has an L3: its repository is beside it
            reads = Reads()
            threads = [
                threading.Thread(target=_reader, args=(f"127.0.0.1:{http}", args.tables, reads, i))
                for i in range(args.readers)
            ]
            for t in threads:
                t.start()
            try:
                for name, old, new in (("activate", 1, 2), ("rollback", 2, 1)):
                    time.sleep(args.settle)
                    t0 = time.perf_counter()
                    activate(config, "demo", new, control, repo)
                    t1 = time.perf_counter()
                    time.sleep(args.settle)
                    yield _step(reads, name, str(old), str(new), t0, t1, args.settle)
            finally:
                reads.stop.set()
                for t in threads:
                    t.join()
        finally:
            _stop(proc)

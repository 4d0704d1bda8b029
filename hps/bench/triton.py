"""Triton serving: HPS lookups vs. an identity model of the same tensor sizes, same server.

The bench writes a demo model (``--tables`` tables of up to ``--rows`` rows, dim ``--dim``),
serves it with ``--instances`` instances next to ``hps_floor`` (which reads the same
KEYS/NUMKEYS and answers zeros of the same size, with as many instances), warms L1, then
for each ``--concurrency`` level sends ``--requests`` requests of ``--batch`` samples x
``--tables`` tables (one key per table per sample, Zipf ``--alpha`` over each table's rows)
to the floor and to HPS, alternately in rounds. ``ratio`` is HPS's p50 over the floor's.

``l1_share`` .. ``default_share``: the unique keys of the level's HPS requests answered by
each level, from Triton's /metrics (null when none was counted). A model instance sends its
counters there at the end of a request, once per metrics interval (1 s; 0 would add their
round trips to every request timed), so before each reading the bench waits one interval,
then sends key-less requests until every instance has reported again (:func:`settled_text`).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hps.bench.options import zipf_exponent
from hps.cli import non_negative_int, positive_int, positive_ints
from hps.errors import BackendUnavailable
from hps.types import JSON

FLOOR = "hps_floor"
LEVELS = ("l1", "l2", "l3", "default")
METRICS_INTERVAL_S = 1.0  # how often the bench's model instances report to /metrics
SETTLE_TRIES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", type=positive_int, default=26)
    parser.add_argument(
        "--rows", type=positive_int, default=100_000, help="rows of the largest table"
    )
    parser.add_argument("--dim", type=positive_int, default=16)
    parser.add_argument("--batch", type=positive_int, default=1024, help="samples per request")
    parser.add_argument(
        "--alpha", type=zipf_exponent, default=1.2, help="Zipf exponent of the keys (above 1)"
    )
    parser.add_argument("--instances", type=positive_int, default=2, help="instances of each model")
    parser.add_argument(
        "--concurrency",
        type=positive_ints,
        default=[1, 8, 64],
        help="clients in flight, per level (default: 1,8,64)",
    )
    parser.add_argument("--requests", type=positive_int, default=200, help="per model and level")
    parser.add_argument("--rounds", type=positive_int, default=4, help="floor/HPS alternations")
    parser.add_argument(
        "--warmup", type=non_negative_int, default=64, help="requests before measuring"
    )
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--dir", help="keep the demo model here (default: a temp folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gate",
        action="store_true",
        help="send every request through the request-size gate (nginx), as hps serve does",
    )


def zipf_requests(
    n: int, batch: int, rows: list[int], alpha: float, rng: np.random.Generator
) -> list[dict[str, np.ndarray]]:
    """``n`` HPS requests: per table ``batch`` keys from a Zipf law over its rows."""
    out: list[dict[str, np.ndarray]] = []
    for _ in range(n):
        keys = np.concatenate([(rng.zipf(alpha, batch) - 1) % r for r in rows]).astype(np.int64)
        numkeys = np.full((1, len(rows)), batch, dtype=np.int32)
        out.append({"KEYS": keys.reshape(1, -1), "NUMKEYS": numkeys})
    return out


def drive(
    url: str, grpc: bool, model: str, requests: list[dict[str, np.ndarray]], concurrency: int
) -> tuple[np.ndarray, float]:
    """Send all requests with ``concurrency`` clients; (latencies in s, elapsed s).

    Each client connects before the clock starts (a barrier): at 64 clients the connection
    set-up would otherwise count as serving time, a few hundred ms per round on 2 cores."""
    from hps.triton.client import Client

    latencies = np.zeros(len(requests))
    lock = threading.Lock()
    next_index = [0]
    errors: list[BaseException] = []
    connected = threading.Barrier(concurrency + 1)

    def worker() -> None:
        with Client(url, grpc=grpc) as client:
            try:
                client.model_ready(model)  # connects now, not in the first timed request
                connected.wait(timeout=60)
            except BaseException as exc:
                errors.append(exc)
                connected.abort()
                return
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= len(requests):
                    return
                start = time.perf_counter()
                try:
                    client.infer(model, requests[i])
                except BaseException as exc:  # reported after the threads join
                    errors.append(exc)
                    return
                latencies[i] = time.perf_counter() - start

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a worker's error, raised below
        connected.wait(timeout=60)
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return latencies, elapsed


def _series(text: str, family: str, model: str) -> Iterator[tuple[str, float]]:
    """The labels and values of ``family``'s series of ``model`` in a /metrics text."""
    pattern = re.compile(rf"^{family}\{{([^}}]*)\}} (\S+)$", re.M)
    for labels, value in pattern.findall(text):
        if f'model="{model}"' in labels:
            yield labels, float(value)


def level_hits(text: str, model: str) -> dict[str, float]:
    """Unique keys answered by each level so far, from a /metrics text."""
    totals = dict.fromkeys(LEVELS, 0.0)
    for labels, value in _series(text, "hps_hits_total", model):
        if level := re.search(r'level="(\w+)"', labels):
            totals[level.group(1)] += value
    return totals


def hit_shares(hits: dict[str, float]) -> dict[str, float | None]:
    """Each level's share of ``hits``; None for all when nothing was counted."""
    total = sum(hits.values())
    return {f"{k}_share": round(v / total, 4) if total else None for k, v in hits.items()}


def reported_requests(text: str, model: str) -> dict[str, float]:
    """Requests each instance of ``model`` (label ``process``) has reported so far."""
    out = {}
    for labels, value in _series(text, "hps_requests_total", model):
        if process := re.search(r'process="([^"]*)"', labels):
            out[process.group(1)] = value
    return out


def scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        return str(resp.read().decode())


def settled_text(metrics_url: str, url: str, grpc: bool, tables: int, instances: int) -> str:
    """/metrics once every instance of the HPS model has reported what it counted so far.

    An instance reports at the end of a request once ``METRICS_INTERVAL_S`` passed since
    its last report: wait that long, then send requests without keys (no hits) until each
    instance's ``hps_requests_total`` has grown."""
    from hps.ctr.demo import DEMO_MODEL

    time.sleep(METRICS_INTERVAL_S)
    before = reported_requests(scrape(metrics_url), DEMO_MODEL)
    keyless: dict[str, np.ndarray] = {
        "KEYS": np.zeros((1, 0), dtype=np.int64),
        "NUMKEYS": np.zeros((1, tables), dtype=np.int32),
    }
    for _ in range(SETTLE_TRIES):
        drive(url, grpc, DEMO_MODEL, [keyless] * instances, instances)
        text = scrape(metrics_url)
        now = reported_requests(text, DEMO_MODEL)
        if all(now.get(p, 0.0) > n for p, n in before.items()):
            return text
    raise BackendUnavailable(f"{DEMO_MODEL}'s instances did not all report to /metrics")


def run(args: argparse.Namespace) -> Iterator[JSON]:
    from hps.ctr.demo import DEMO_MODEL, create_demo, table_sizes
    from hps.triton.repository import copy_template, prepare_repository
    from hps.triton.serving import prepare_tables, serving_config
    from hps.triton.supervisor.gate import BodyLimit
    from hps.triton.supervisor.server import TritonServer

    with tempfile.TemporaryDirectory(prefix="hps-bench-triton-") as tmp:
        root = Path(args.dir or tmp)
        ps = create_demo(
            root / "demo",
            num_tables=args.tables,
            max_rows=args.rows,
            dim=args.dim,
            instances=args.instances,
            force=args.dir is None,
        )
        config = serving_config(ps)
        repo = Path(tmp) / "repository"
        prepare_repository(config, repo, metrics_interval_s=METRICS_INTERVAL_S)
        dims = ",".join(str(t.dim) for t in config.models[0].tables)
        copy_template(FLOOR, repo, FLOOR, args.instances, {"dims": dims})
        prepare_tables(config)
        rng = np.random.default_rng(args.seed)
        rows = table_sizes(args.tables, args.rows)
        levels = args.concurrency
        server = TritonServer(
            repo,
            explicit=True,
            load_models=[DEMO_MODEL, FLOOR],
            log_file=Path(tmp) / "log",
            body_limit=BodyLimit.for_config(config) if args.gate else None,
        )
        with server:
            url = server.grpc_url if args.protocol == "grpc" else server.http_url
            grpc = args.protocol == "grpc"
            warm = zipf_requests(args.warmup, args.batch, rows, args.alpha, rng)
            drive(url, grpc, DEMO_MODEL, warm, max(levels))
            drive(url, grpc, FLOOR, warm, max(levels))
            settled = (server.metrics_url, url, grpc, args.tables, args.instances)
            after = level_hits(settled_text(*settled), DEMO_MODEL)
            for level in levels:
                before = after
                stats: dict[str, list[tuple[np.ndarray, float]]] = {DEMO_MODEL: [], FLOOR: []}
                per_round = max(1, args.requests // args.rounds)
                for _ in range(args.rounds):
                    reqs = zipf_requests(per_round, args.batch, rows, args.alpha, rng)
                    for model in (FLOOR, DEMO_MODEL):
                        stats[model].append(drive(url, grpc, model, reqs, level))
                after = level_hits(settled_text(*settled), DEMO_MODEL)
                hits = {k: after[k] - before[k] for k in after}
                yield _row(args, level, stats) | hit_shares(hits)


def _row(
    args: argparse.Namespace, level: int, stats: dict[str, list[tuple[np.ndarray, float]]]
) -> JSON:
    from hps.ctr.demo import DEMO_MODEL

    def summary(model: str) -> tuple[float, float, float]:
        lat = np.concatenate([s[0] for s in stats[model]]) * 1e3
        elapsed = sum(s[1] for s in stats[model])
        return float(np.median(lat)), float(np.percentile(lat, 99)), lat.size / elapsed

    p50, p99, rps = summary(DEMO_MODEL)
    f50, f99, frps = summary(FLOOR)
    return {
        "bench": "triton",
        "model": DEMO_MODEL,
        "protocol": args.protocol,
        "gate": args.gate,
        "batch": args.batch,
        "tables": args.tables,
        "dim": args.dim,
        "instances": args.instances,
        "concurrency": level,
        "requests": int(sum(s[0].size for s in stats[DEMO_MODEL])),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "throughput_rps": round(rps, 1),
        "floor_p50_ms": round(f50, 3),
        "floor_p99_ms": round(f99, 3),
        "floor_throughput_rps": round(frps, 1),
        "ratio": round(p50 / f50, 3),
    }

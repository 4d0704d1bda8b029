"""Triton serving: HPS lookups vs. an identity model of the same tensor sizes, same server.

The bench writes a demo model (``--tables`` tables of up to ``--rows`` rows, dim ``--dim``),
serves it with ``--instances`` instances next to ``hps_floor`` (which reads the same
KEYS/NUMKEYS and answers zeros of the same size, with as many instances), warms L1, then
for each ``--concurrency`` level sends ``--requests`` requests of ``--batch`` samples x
``--tables`` tables (one key per table per sample, Zipf ``--alpha`` over each table's rows)
to the floor and to HPS, alternately in rounds. ``ratio`` is HPS's p50 over the floor's.
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

from hps.types import JSON

FLOOR = "hps_floor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the largest table")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024, help="samples per request")
    parser.add_argument("--alpha", type=float, default=1.2, help="Zipf exponent of the keys")
    parser.add_argument("--instances", type=int, default=2, help="instances of each model")
    parser.add_argument("--concurrency", default="1,8,64", help="clients in flight, per level")
    parser.add_argument("--requests", type=int, default=200, help="per model and level")
    parser.add_argument("--rounds", type=int, default=4, help="floor/HPS alternations")
    parser.add_argument("--warmup", type=int, default=64, help="requests before measuring")
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


def level_hits(metrics_url: str, model: str) -> dict[str, float]:
    """Unique keys answered by each level so far, from Triton's /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    totals = dict.fromkeys(("l1", "l2", "l3", "default"), 0.0)
    pattern = re.compile(r"^hps_hits_total\{([^}]*)\} (\S+)$", re.M)
    for labels, value in pattern.findall(text):
        level = re.search(r'level="(\w+)"', labels)
        if f'model="{model}"' in labels and level:
            totals[level.group(1)] += float(value)
    return totals


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
        prepare_repository(config, repo)
        dims = ",".join(str(t.dim) for t in config.models[0].tables)
        copy_template(FLOOR, repo, FLOOR, args.instances, {"dims": dims})
        prepare_tables(config)
        rng = np.random.default_rng(args.seed)
        rows = table_sizes(args.tables, args.rows)
        levels = [int(c) for c in args.concurrency.split(",")]
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
            for level in levels:
                before = level_hits(server.metrics_url, DEMO_MODEL)
                stats: dict[str, list[tuple[np.ndarray, float]]] = {DEMO_MODEL: [], FLOOR: []}
                per_round = max(1, args.requests // args.rounds)
                for _ in range(args.rounds):
                    reqs = zipf_requests(per_round, args.batch, rows, args.alpha, rng)
                    for model in (FLOOR, DEMO_MODEL):
                        stats[model].append(drive(url, grpc, model, reqs, level))
                after = level_hits(server.metrics_url, DEMO_MODEL)
                hits = {k: after[k] - before[k] for k in after}
                total = sum(hits.values()) or 1.0
                shares = {f"{k}_share": round(v / total, 4) for k, v in hits.items()}
                yield _row(args, level, stats) | shares


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

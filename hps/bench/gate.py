"""The request-size gate: what a flood of oversized requests costs Triton and its neighbours.

The bench writes a demo model (``--tables`` tables of up to ``--rows`` rows, dim ``--dim``),
serves it with ``--instances`` instances and puts the gate (nginx, as ``hps serve`` does) in
front of it. A flood client (its own process, at nice 19 so that its own serialisation
does not count against the server) sends requests of ``--flood-mb`` MB, far over the
models' limits, as fast as it can. Two kinds of rows, one JSON object each:

- ``neighbour_p99`` per ``--paths`` entry: a neighbour sends ``--requests`` lookups of
  ``--batch`` samples (one key per table per sample) with the flood stopped (SIGSTOP) and
  running, alternately, ``--rounds`` times; ``p99_alone_ms`` and ``p99_beside_flood_ms``
  are the medians of the rounds' p99, ``ratio`` the second over the first. ``gate`` sends
  both through the gate; ``direct`` straight to Triton, the baseline without a gate.
- ``refusal_cpu`` per ``--protocols`` entry: Triton's CPU (tritonserver and its model
  stubs) per refused flood request sent straight to Triton (the model refuses it) and
  through the gate (nginx refuses it), over ``--refusals`` requests each; ``ratio`` is
  gated over direct. ``gate_cpu_ms`` is nginx's own CPU per refusal.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hps.bench.flood import Flood, process_cpu_ms
from hps.bench.options import listed, one_of, zipf_exponent
from hps.cli import positive_float, positive_int
from hps.types import JSON

if TYPE_CHECKING:
    from hps.triton.client import Client
    from hps.triton.supervisor.gate import RequestGate
    from hps.triton.supervisor.server import TritonServer


PATHS = ("gate", "direct")
PROTOCOLS = ("grpc", "http")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", type=positive_int, default=26)
    parser.add_argument(
        "--rows", type=positive_int, default=100_000, help="rows of the largest table"
    )
    parser.add_argument("--dim", type=positive_int, default=16)
    parser.add_argument("--instances", type=positive_int, default=2, help="instances of the model")
    parser.add_argument(
        "--batch", type=positive_int, default=32, help="samples per neighbour request"
    )
    parser.add_argument(
        "--alpha", type=zipf_exponent, default=1.2, help="Zipf exponent of the keys (above 1)"
    )
    parser.add_argument(
        "--requests", type=positive_int, default=150, help="neighbour requests a round"
    )
    parser.add_argument("--rounds", type=positive_int, default=9, help="alone/beside alternations")
    parser.add_argument("--refusals", type=positive_int, default=20, help="per protocol and path")
    parser.add_argument(
        "--flood-mb", type=positive_float, default=8.0, help="size of a flood request"
    )
    protocols = listed(one_of(*PROTOCOLS))
    parser.add_argument("--paths", type=listed(one_of(*PATHS)), default=",".join(PATHS),
                        help="neighbour rows: gate, direct")  # fmt: skip
    parser.add_argument("--protocols", type=protocols, default=",".join(PROTOCOLS),
                        help="refusal_cpu rows: grpc, http")  # fmt: skip
    parser.add_argument("--flood-protocols", type=protocols, default="grpc",
                        help="of the neighbour rows' flood: grpc, http")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)


def _flood_keys(args: argparse.Namespace) -> int:
    """Keys (int64) of a flood request of ``--flood-mb`` MB."""
    return int(args.flood_mb * 2**20) // 8


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A flood the gate would let through on one of the protocols it is sent on (HTTP's
    limit, that of a JSON body, is the larger) is refused before anything starts."""
    from hps.config import load_config
    from hps.ctr.demo import create_demo
    from hps.triton.supervisor.gate import BodyLimit

    with tempfile.TemporaryDirectory(prefix="hps-bench-gate-") as tmp:
        # The limits follow the models' shape (tables, batch), not the rows: a small demo.
        ps = create_demo(Path(tmp), num_tables=args.tables, max_rows=min(args.rows, 1000),
                         dim=args.dim, instances=args.instances, force=True)  # fmt: skip
        limit = BodyLimit.for_config(load_config(ps))
    body = _flood_keys(args) * 8  # binary tensors on both protocols
    for protocol in sorted({*args.protocols, *args.flood_protocols}):
        if body <= getattr(limit, protocol):
            parser.error(
                f"--flood-mb {args.flood_mb:g} is within the gate's {protocol} limit "
                f"({limit.describe()}); the flood must exceed it on every protocol it is sent on"
            )


@dataclass
class _Served:
    """The demo model behind Triton and the gate in front of it."""

    server: TritonServer
    gate: RequestGate
    model: str
    tables: int
    rows: list[int]

    def urls(self, path: str) -> tuple[str, str]:
        """(gRPC, HTTP) addresses of ``path``: ``gate`` or ``direct``."""
        if path == "gate":
            return f"127.0.0.1:{self.gate.grpc_port}", f"127.0.0.1:{self.gate.http_port}"
        return self.server.grpc_url, self.server.http_url


def run(args: argparse.Namespace) -> Iterator[JSON]:
    from hps.ctr.demo import DEMO_MODEL, create_demo, table_sizes
    from hps.net import free_port
    from hps.triton.repository import prepare_repository
    from hps.triton.serving import prepare_tables, serving_config
    from hps.triton.supervisor.gate import BodyLimit, RequestGate
    from hps.triton.supervisor.server import TritonServer

    paths: list[str] = args.paths
    protocols: list[str] = args.protocols
    with tempfile.TemporaryDirectory(prefix="hps-bench-gate-") as tmp:
        root = Path(tmp)
        ps = create_demo(
            root / "demo", num_tables=args.tables, max_rows=args.rows, dim=args.dim,
            instances=args.instances, force=True,
        )  # fmt: skip
        config = serving_config(ps)
        repo = root / "repository"
        prepare_repository(config, repo)
        prepare_tables(config)
        limit = BodyLimit.for_config(config)
        flood_keys = _flood_keys(args)
        server = TritonServer(repo, explicit=True, load_models=[DEMO_MODEL], log_file=root / "log")
        with server:
            gate = RequestGate(
                limit, root / "gate", upstream_http=server.http_port,
                upstream_grpc=server.grpc_port, http_port=free_port(), grpc_port=free_port(),
                log_file=root / "gate.log",
            )  # fmt: skip
            with gate:
                served = _Served(
                    server, gate, DEMO_MODEL, args.tables, table_sizes(args.tables, args.rows)
                )
                common = {"bench": "gate", "model": DEMO_MODEL, "flood_mb": args.flood_mb}
                for path in paths:
                    yield common | _neighbour_row(args, served, path, flood_keys)
                for protocol in protocols:
                    yield common | _refusal_row(args, served, protocol, flood_keys)


def _latencies_ms(client: Client, model: str, requests: list[dict[str, np.ndarray]]) -> np.ndarray:
    times = np.zeros(len(requests))
    for i, request in enumerate(requests):
        start = time.perf_counter()
        client.infer(model, request)
        times[i] = (time.perf_counter() - start) * 1e3
    return times


def _neighbour_row(args: argparse.Namespace, served: _Served, path: str, flood_keys: int) -> JSON:
    from hps.bench.triton import zipf_requests
    from hps.triton.client import Client

    rng = np.random.default_rng(args.seed)
    grpc_url, http_url = served.urls(path)
    flood_protocols = tuple(args.flood_protocols)
    alone: list[float] = []
    beside: list[float] = []
    flood = Flood(grpc_url, http_url, served.model, served.tables, flood_keys, flood_protocols)
    with flood, Client(grpc_url, grpc=True) as client:
        first = len(flood.answers)
        warm = zipf_requests(20, args.batch, served.rows, args.alpha, rng)
        _latencies_ms(client, served.model, warm)
        for _ in range(args.rounds):
            reqs = zipf_requests(args.requests, args.batch, served.rows, args.alpha, rng)
            flood.pause()
            alone.append(float(np.percentile(_latencies_ms(client, served.model, reqs), 99)))
            flood.resume()
            time.sleep(0.2)
            beside.append(float(np.percentile(_latencies_ms(client, served.model, reqs), 99)))
        statuses = flood.statuses(first)
    if path == "gate":
        _check_refused_by_gate(statuses)
    p99_alone, p99_beside = float(np.median(alone)), float(np.median(beside))
    return {
        "measure": "neighbour_p99",
        "path": path,
        "protocol": "grpc",
        "flood_protocols": list(flood_protocols),
        "batch": args.batch,
        "tables": args.tables,
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "p99_alone_ms": round(p99_alone, 3),
        "p99_beside_flood_ms": round(p99_beside, 3),
        "ratio": round(p99_beside / p99_alone, 3),
        "rounds_alone_ms": [round(x, 3) for x in alone],
        "rounds_beside_ms": [round(x, 3) for x in beside],
        "flood_answers": statuses,
    }


GATE_REFUSALS = {"grpc": "StatusCode.RESOURCE_EXHAUSTED", "http": "413"}


def _check_refused_by_gate(statuses: dict[str, int]) -> None:
    """Every flood answer through the gate must be its refusal (HTTP 413, gRPC
    RESOURCE_EXHAUSTED): any other means the flood reached Triton, and the row would not
    measure the gate."""
    other = {
        answer: n for answer, n in statuses.items()
        if answer.split(" ", 1)[1] != GATE_REFUSALS.get(answer.split(" ", 1)[0])
    }  # fmt: skip
    if other:
        raise RuntimeError(f"flood answers through the gate that are not its refusal: {other}")


def _refusal_row(args: argparse.Namespace, served: _Served, protocol: str, flood_keys: int) -> JSON:
    from hps.errors import RequestError
    from hps.triton.client import Client

    request: dict[str, np.ndarray] = {
        "KEYS": np.zeros((1, flood_keys), np.int64),
        "NUMKEYS": np.array([[flood_keys] + [0] * (served.tables - 1)], np.int32),
    }
    assert served.server.proc is not None and served.gate.proc is not None  # both started
    triton_pid, gate_pid = served.server.proc.pid, served.gate.proc.pid
    cpu: dict[str, tuple[float, float]] = {}
    for path in ("direct", "gate"):
        grpc_url, http_url = served.urls(path)
        with Client(grpc_url if protocol == "grpc" else http_url, grpc=protocol == "grpc") as c:
            triton0, gate0 = process_cpu_ms(triton_pid), process_cpu_ms(gate_pid)
            for _ in range(args.refusals):
                try:
                    c.infer(served.model, request)
                except RequestError:
                    pass
                else:
                    raise RuntimeError(f"a {args.flood_mb} MB request was answered ({path})")
            cpu[path] = (
                (process_cpu_ms(triton_pid) - triton0) / args.refusals,
                (process_cpu_ms(gate_pid) - gate0) / args.refusals,
            )
    direct, gated = cpu["direct"][0], cpu["gate"][0]
    return {
        "measure": "refusal_cpu",
        "protocol": protocol,
        "requests": args.refusals,
        "direct_triton_cpu_ms": round(direct, 2),
        "gated_triton_cpu_ms": round(gated, 2),
        "gate_cpu_ms": round(cpu["gate"][1], 2),
        "ratio": round(gated / direct, 3) if direct else None,
    }

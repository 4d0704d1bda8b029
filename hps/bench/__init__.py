"""Benchmarks: each measures our code and its baseline in the same run, one JSON line each.

A bench module exposes ``add_arguments(parser)`` and ``run(args) -> Iterator[dict]``, and
may expose ``check_arguments(parser, args)``: what no option's type can check alone (one
option against another), refused with ``parser.error`` (status 2) before any work starts.
"""

BENCHES: dict[str, str] = {
    "storage": "hps.bench.storage",
    "cache": "hps.bench.cache",
    "shm": "hps.bench.shm",
    "updates": "hps.bench.updates",
    "triton": "hps.bench.triton",
    "gate": "hps.bench.gate",
    "memory": "hps.bench.memory",
    "freshness": "hps.bench.freshness",
    "rollout": "hps.bench.rollout",
}

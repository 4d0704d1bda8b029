"""``hps bench <name> [options]``: run one benchmark, print one JSON object per line.

Bench modules are imported only when run, so one bench's dependencies never break the CLI.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from hps.bench import BENCHES


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="run a benchmark (one JSON object per line)",
        description=f"Benchmarks: {', '.join(BENCHES)}. `hps bench NAME --help` lists options.",
    )
    bench.add_argument("bench", choices=sorted(BENCHES), metavar="NAME", help=", ".join(BENCHES))
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options of that benchmark")
    bench.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    mod = importlib.import_module(BENCHES[args.bench])
    parser = argparse.ArgumentParser(
        prog=f"hps bench {args.bench}", description=(mod.__doc__ or "").strip()
    )
    mod.add_arguments(parser)
    for row in mod.run(parser.parse_args(args.options)):
        print(json.dumps(row), flush=True)
    sys.stdout.flush()
    return 0

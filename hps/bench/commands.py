"""``hps bench <name>``: run one benchmark and print one JSON object per line."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from hps.bench import BENCHES


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="run a benchmark (one JSON object per line)")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, module in BENCHES.items():
        mod = importlib.import_module(module)
        parser = benches.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(parser)
        parser.set_defaults(func=lambda args, mod=mod: _run(mod, args))


def _run(mod: object, args: argparse.Namespace) -> int:
    for row in mod.run(args):  # type: ignore[attr-defined]
        print(json.dumps(row), flush=True)
    sys.stdout.flush()
    return 0

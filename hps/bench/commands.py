"""``hps bench <name> [options]``: run one benchmark, print one JSON object per line.

Bench modules are imported only when run, so one bench's dependencies never break the CLI.
SIGTERM stops a bench as Ctrl-C does (status 130): the bench's ``finally`` clauses stop the
servers it started and remove its shared memory and temporary folders.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys

from hps.bench import BENCHES
from hps.cli import sigterm_interrupts


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
    options = parser.parse_args(args.options)
    check = getattr(mod, "check_arguments", None)
    if check is not None:  # what one option cannot tell alone, refused before any work
        check(parser, options)
    # closing(): an interrupt while a row is printed still runs the bench's finally clauses
    # now, not whenever the suspended generator is collected.
    with sigterm_interrupts(), contextlib.closing(mod.run(options)) as rows:
        for row in rows:
            print(json.dumps(row), flush=True)
    sys.stdout.flush()
    return 0

"""The ``hps`` console script.

Each area registers its own sub-commands (``register(subparsers)`` in its ``commands``
module); handlers import their heavy dependencies lazily so ``hps --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from hps.errors import HPSError

COMMAND_MODULES = [
    "hps.commands.tables",  # import, export, lookup
    "hps.commands.plan",  # plan, freq
    "hps.commands.verify",  # verify
    "hps.commands.versions",  # versions (list, activate, retire, rollout)
    "hps.bench.commands",  # bench NAME (storage, cache, shm, triton, gate, updates, ...)
    "hps.triton.commands",  # demo, serve, repository, reload, query, install-triton
    "hps.updates.commands",  # consume, consume-check, publish, repair-versions
    "hps.loadtest.commands",  # loadtest (Locust: the `load` extra)
    "hps.service.commands",  # admin
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hps", description="Hierarchical inference parameter server for embeddings."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
    except BrokenPipeError:  # `hps bench ... | head`: stop quietly, as other filters do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it


def _dispatch(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except HPSError as exc:
        from hps.redact import scrub

        print(f"hps {args.command}: error: {scrub(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

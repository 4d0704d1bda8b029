"""The ``hps`` console script.

Each area registers its own sub-commands (``register(subparsers)`` in its ``commands``
module); handlers import their heavy dependencies lazily so ``hps --help`` stays fast.
The argparse types every command shares are here (:func:`positive_int`, :func:`port`, ...):
a number out of range is a usage error that names the option (status 2) before any work.
An :class:`~hps.errors.HPSError`, an ``OSError`` (a path that cannot be read or written)
or a ``MemoryError`` ends a command with ``hps CMD: error: ...`` and status 2, without a
traceback. Ctrl-C ends one with status 130; a command that starts servers, segments or
folders wraps its work in :func:`sigterm_interrupts` so that SIGTERM does the same, after
its ``finally`` clauses.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator

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


SERVICES = {"serve", "consume", "admin"}
"""Commands that run until stopped, whose log (INFO and above) says what they do; the
others (``hps loadtest`` too: its progress is printed) log warnings and errors only
(``--verbose``: everything)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hps", description="Hierarchical inference parameter server for embeddings."
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging (the traceback of an OS error or of running out of memory too); "
        "without it, commands other than serve, consume, admin and loadtest log warnings and "
        "errors only",
    )
    # Not required=True: argparse checks required arguments before unknown ones, and
    # `hps --bogus` would be told that COMMAND is missing; _dispatch asks for it instead.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("the following arguments are required: COMMAND")
    quiet = args.command not in SERVICES  # what it did is on stdout: only problems logged
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except HPSError as exc:
        return _error(args.command, str(exc))
    except BrokenPipeError:
        raise  # a reader that went away: main() ends quietly
    except OSError as exc:  # a path that cannot be written or read, an address refused
        logging.getLogger(__name__).debug("hps %s failed", args.command, exc_info=True)
        return _error(args.command, os_error_text(exc))
    except MemoryError as exc:  # e.g. NumPy's "Unable to allocate ..."
        logging.getLogger(__name__).debug("hps %s failed", args.command, exc_info=True)
        return _error(args.command, f"out of memory: {exc}" if str(exc) else "out of memory")
    except KeyboardInterrupt:
        return 130


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP (unless ignored: ``nohup``) raise
    ``KeyboardInterrupt`` as Ctrl-C does: the command unwinds through its ``finally``
    clauses, which stop what it started (servers, shared memory, temporary folders), and
    ends with status 130 instead of dying where it stood.
    Used by ``hps bench`` and ``hps loadtest``; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = [signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # not under nohup
        stops.append(signal.SIGHUP)  # the terminal closed, an SSH session gone
    previous = {s: signal.signal(s, signal.default_int_handler) for s in stops}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def _error(command: str, message: str) -> int:
    """``hps CMD: error: MESSAGE`` on stderr (registered secrets scrubbed); status 2."""
    from hps.redact import scrub

    print(f"hps {command}: error: {scrub(message)}", file=sys.stderr)
    return 2


def os_error_text(exc: OSError) -> str:
    """``PATH: reason`` (``FROM -> TO: reason`` for a rename), as a shell names it."""
    if exc.strerror is None:
        return str(exc)
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return ": ".join([" -> ".join(paths), exc.strerror] if paths else [exc.strerror])


# -- argparse types shared by every command ------------------------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
PORT_MAX = 65_535


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_int(text: str) -> int:
    """A count or a size: 1 or more."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value}")
    return value


def non_negative_int(text: str) -> int:
    """A count where 0 means none (or all, as the option says)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """Comma-separated positive integers (``1,8,64``)."""
    values = [positive_int(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def port(text: str) -> int:
    """A TCP port to listen on or connect to: 1-65535."""
    value = _int(text)
    if not 1 <= value <= PORT_MAX:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value} (1-{PORT_MAX})")
    return value


def int64(text: str) -> int:
    """A key: a signed 64-bit integer."""
    value = _int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside int64 ({INT64_MIN}..{INT64_MAX})")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def fraction(text: str) -> float:
    """A share: a number from 0 to 1 (``0.25``)."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, not {value:g}")
    return value


def positive_float(text: str) -> float:
    """A rate, a duration or a size: a finite number above 0."""
    value = _float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite amount, 0 or more."""
    value = _float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, not {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())

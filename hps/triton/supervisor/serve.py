"""``hps serve``: the supervisor's run, from a ps.json to a serving tritonserver and back.

In order: check the ports, hold the state dir (:mod:`hps.triton.supervisor.serve_lock`),
clean what a dead predecessor left (:mod:`hps.triton.supervisor.lifecycle`), read the
ps.json as served (:mod:`hps.triton.serving`), write the model repository
(:mod:`hps.triton.repository`), import the tables, make the admin key
(:mod:`hps.triton.admin_key`), start tritonserver behind the request-size gate
(:mod:`hps.triton.supervisor.server`, :mod:`hps.triton.supervisor.gate`), show its output
(:mod:`hps.triton.supervisor.output`), watch its models (:mod:`hps.triton.supervisor.watchdog`)
and, on Ctrl-C or SIGTERM, drain and stop.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from hps.config import PSConfig
from hps.errors import HPSError
from hps.loading.imports import repository_dir
from hps.tempdirs import owned_tempdir
from hps.triton.admin_key import ensure_key
from hps.triton.repository import check_gpu_instances, prepare_repository, served_models
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.address import resolve_host
from hps.triton.supervisor.gate import BodyLimit, find_nginx
from hps.triton.supervisor.lifecycle import check_ports, clean_stale
from hps.triton.supervisor.output import TritonOutput
from hps.triton.supervisor.serve_lock import hold_state_dir
from hps.triton.supervisor.server import TritonServer
from hps.triton.supervisor.watchdog import Watchdog, watched

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, SIGTERM, and SIGHUP (the terminal closed, an SSH session gone) unless it is
ignored (``nohup``): each drains and stops as Ctrl-C does."""
ALREADY_STOPPING = b"hps serve: already stopping (draining requests, then tritonserver)\n"


def serve(args: argparse.Namespace) -> int:
    """``hps serve``: the options as :mod:`hps.triton.commands` parses them; the exit status."""
    with _ctrl_c_interrupts():
        return _serve_ps_json(args)


@contextlib.contextmanager
def _ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in all of ``hps serve``, also when it inherited SIGINT
    ignored (``hps serve &`` from a non-interactive shell), so ``kill -INT`` stops it; the
    caller's handlers of :data:`STOP_SIGNALS` are back afterwards."""
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C or SIGTERM: a KeyboardInterrupt, and from now on the drain's
    handler, set before anything else can run, so a second signal cannot cut the drain."""
    for s in _stop_signals():
        signal.signal(s, _already_stopping)
    raise KeyboardInterrupt


def _stop_signals() -> list[signal.Signals]:
    """:data:`STOP_SIGNALS`, less SIGHUP where it is ignored (``nohup hps serve``: it stays
    ignored)."""
    return [s for s in STOP_SIGNALS
            if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN]  # fmt: skip


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    # os.write to fd 2: the handler may run while the main thread is inside a print to stderr
    with contextlib.suppress(OSError):
        os.write(2, ALREADY_STOPPING)


def _serve_ps_json(args: argparse.Namespace) -> int:
    verbose = bool(getattr(args, "verbose", False))
    if not verbose:  # a quiet start: what goes wrong, and the steps printed below
        logging.getLogger().setLevel(logging.WARNING)
    ports = {"HTTP": args.http_port, "gRPC": args.grpc_port, "metrics": args.metrics_port}
    args.host = resolve_host(args.host)  # once: the address Triton, nginx and clients get
    check_ports(args.host, ports)  # before anything is written or printed
    if args.config is None:
        from hps.ctr.demo import create_demo

        args.config = str(create_demo("demo"))
    state_dir = Path(args.state_dir or Path(args.config).resolve().parent)
    with hold_state_dir(state_dir):  # a second hps serve here stops before it touches a thing
        return _serve(args, state_dir, verbose)


def _serve(args: argparse.Namespace, state_dir: Path, verbose: bool) -> int:
    for path in clean_stale():
        print(f"removed {path}, left by an hps process that has ended", file=sys.stderr)
    config = serving_config(args.config)
    from hps.redact import protect
    from hps.updates.kafka import check_update_source

    protect(config)  # every log record scrubbed; the config's secrets registered
    check_update_source(config)  # a bad Kafka setting is a config error before any work
    check_gpu_instances(config)  # GPU instances on a node without a GPU, likewise
    tables = sum(len(m.tables) for m in config.models)
    print(
        f"hps serve: {args.config}: {_plural(len(config.models), 'model')}, "
        f"{_plural(tables, 'table')}",
        flush=True,
    )
    tmp = owned_tempdir("hps-repo-")
    try:
        # beside L3 when there is a node state folder: the control plane writes new model
        # versions' folders there (hps.versions.rollout)
        repo = Path(args.repository or repository_dir(config) or tmp)
        names = prepare_repository(config, repo, metrics_interval_s=args.metrics_interval)
        _import(config, verbose)
        key, key_file = _admin_key(state_dir, tmp)
        output = TritonOutput(
            verbose=verbose, instances={m.triton_name: m.instances for m in served_models(config)}
        )
        server = TritonServer(
            repo,
            body_limit=body_limit(config, args.max_request_mb),
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            host=args.host,
            explicit=True,
            load_models=names,
            admin_key=key,
            output=output,
        )
        return _run(server, config, args, key_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _import(config: PSConfig, verbose: bool) -> None:
    """Bring L3 (and a shared L2) up to date with the sparse files: one line, or one per
    table (and a progress bar) when verbose."""
    start = time.perf_counter()
    imported = prepare_tables(config, progress=verbose)
    if verbose:
        for table, rows in imported.items():
            print(f"imported {table}: {rows:,} rows")
    elif imported:
        print(
            f"imported {_plural(len(imported), 'table')}: {sum(imported.values()):,} rows "
            f"in {time.perf_counter() - start:.1f}s",
            flush=True,
        )


def body_limit(config: PSConfig, max_request_mb: float | None) -> BodyLimit | None:
    """The request-size gate's limit: derived from the config unless given; exactly 0: no
    gate (``hps serve`` refuses a negative --max-request-mb as it parses it)."""
    if max_request_mb == 0:
        return None
    find_nginx()  # its absence is a ConfigError that says what to do, before any work
    if max_request_mb is None:
        return BodyLimit.for_config(config)
    return BodyLimit.of(int(max_request_mb * 2**20))


def _admin_key(state_dir: str | Path, fallback: Path) -> tuple[str, Path | None]:
    try:
        return ensure_key(state_dir)
    except OSError:  # a read-only config folder: keep it beside the repository
        return ensure_key(fallback)


def _run(server: TritonServer, config: PSConfig, args: argparse.Namespace, key: Path | None) -> int:
    """Serve until Ctrl-C / SIGTERM (then drain: exit 0 if clean) or until Triton exits;
    while it stops, a further Ctrl-C or SIGTERM says it is stopping already and waits."""
    watchdog = None
    for s in _stop_signals():
        signal.signal(s, _interrupt)
    try:
        print(f"starting Triton: {', '.join(server.load_models)}", flush=True)
        try:
            server.start()
        except HPSError:
            if server.output is not None and not server.output.verbose:
                print("what tritonserver said last:", file=sys.stderr)
                for line in server.output.tail():
                    print(f"  {line}", file=sys.stderr)
            raise
        if server.output is not None:
            server.output.ready()  # its warm-up lines out, from here warnings and errors
        if args.watchdog_interval > 0:
            probes, instances = watched(config)
            assert server.proc is not None
            watchdog = Watchdog(
                server.http_url,
                server.admin_key,
                probes,
                interval=args.watchdog_interval,
                server_pid=server.proc.pid,
                instances=instances,
            )
            watchdog.start()
        _print_banner(server, config, args.config, key)
        name, status = server.wait()
        print(f"{name} exited by itself (status {status})", file=sys.stderr)
        return status if status > 0 else 1  # a signal's negative status is no exit code
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # a terminal gone (SIGHUP) takes no more lines
            print("stopping: draining requests, then tritonserver", file=sys.stderr, flush=True)
    finally:
        for s in _stop_signals():  # Triton exited by itself: no signal has set them yet
            signal.signal(s, _already_stopping)
        if watchdog is not None:
            watchdog.stop()
        problems = server.stop()
    for problem in problems:
        print(f"unclean shutdown: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _hps_command() -> str:
    """How the user can run this very ``hps`` again (a venv's is often not on PATH)."""
    me = Path(sys.argv[0]).resolve()
    on_path = shutil.which("hps")
    if on_path and Path(on_path).resolve() == me:
        return "hps"
    if me.name == "hps":
        return os.path.relpath(me) if me.is_relative_to(Path.cwd()) else str(me)
    return f"{sys.executable} -m hps.cli"


def _print_banner(server: TritonServer, config: PSConfig, path: str, key: Path | None) -> None:
    """The end of the start: where to reach the server, the ready line, the commands to paste."""
    hps = _hps_command()
    served = served_models(config)
    tries = [
        f"{hps} query --url {server.http_url} --model {m.triton_name} "
        + ("--samples 2" if m.template == "hps_ctr" else "--keys 1,2,3")
        for m in served
    ]
    names = [m.triton_name for m in served]
    gate = (
        f"request bodies up to {server.body_limit.describe()} (the request-size gate)"
        if server.body_limit
        else "no request-size gate (--max-request-mb 0): Triton reads any body"
    )
    print(
        f"  HTTP {server.http_url}   gRPC {server.grpc_url}   metrics {server.metrics_url}\n"
        f"  {gate}\n"
        "  admin APIs (model control, shared memory, logging, trace) need the header "
        f"hps-admin-key: {f'the key in {key}' if key else 'the key in $HPS_ADMIN_KEY'}\n"
        f"ready: serving {', '.join(names)} from {path} (Ctrl-C stops). Try:\n"
        + "".join(f"  {t}\n" for t in tries),
        end="",
        flush=True,
    )

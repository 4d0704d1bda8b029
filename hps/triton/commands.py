"""``hps demo``, ``hps serve``, ``hps query``, ``hps reload`` (install-triton: install.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hps.config import PSConfig
    from hps.triton.gate import BodyLimit
    from hps.triton.server import TritonServer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="create a small synthetic CTR model to serve (if absent)")
    p.add_argument("--dir", default="demo", help="folder of the demo model (default: demo)")
    p.add_argument("--tables", type=int, default=26, help="embedding tables (default: 26)")
    p.add_argument("--rows", type=int, default=100_000, help="rows of the largest table")
    p.add_argument("--dim", type=int, default=16, help="embedding vector size (default: 16)")
    p.add_argument("--instances", type=int, default=1, help="Triton instances of the model")
    p.add_argument("--force", action="store_true", help="overwrite an existing demo")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "serve",
        help="serve a ps.json through Triton (default: the demo model)",
        description="Validate the config, import its sparse_files into L3 where needed, "
        "prepare a model repository and run tritonserver until Ctrl-C or SIGTERM.",
    )
    p.add_argument("--config", help="ps.json (default: create and serve demo/ps.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--repository", help="where to write the model repository (default: temp)")
    p.add_argument("--metrics-interval", type=float, default=1.0, help="seconds between updates")
    p.add_argument(
        "--state-dir", help="where a generated admin key is kept (default: the ps.json's folder)"
    )
    p.add_argument(
        "--watchdog-interval", type=float, default=2.0, help="seconds between probes (0: off)"
    )
    p.add_argument(
        "--max-request-mb",
        type=float,
        help="largest gRPC request the request-size gate (nginx) lets through; HTTP 3x that "
        "(default: the largest the models' key limits allow; 0: no gate, Triton listens "
        "itself; docs/security.md)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # keeps `hps -v serve` working too
        help="show every step: per-table imports and warm-up, the tritonserver command "
        "line (secrets redacted), Triton's and the models' own logs",
    )
    p.set_defaults(func=_serve)

    p = sub.add_parser(
        "repository",
        help="write the Triton model repository hps serve serves, and exit",
        description="Write the Triton model repository `hps serve` would serve for a ps.json "
        "(per served model: config.pbtxt and 1/model.py) and exit. Without --config: the "
        "demo's, as checked in at model_repository/ (make model-repository).",
    )
    p.add_argument("--config", help="ps.json (default: the demo, demo/ps.json beside --out)")
    p.add_argument("--out", default="model_repository", help="folder (default: model_repository)")
    p.add_argument(
        "--relative",
        action="store_true",
        help="name the ps.json relative to each model's folder (always so without --config)",
    )
    p.set_defaults(func=_repository)

    p = sub.add_parser("reload", help="reload a served model (picks up retrained tables)")
    p.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP address")
    p.add_argument("--model", default="demo", help="Triton model name (default: demo)")
    p.add_argument("--config", help="ps.json it is served from (finds the admin key file)")
    p.add_argument("--state-dir", help="folder of the admin key file, if not the ps.json's")
    p.set_defaults(func=_reload)

    p = sub.add_parser("query", help="send one request to a served model and print the answer")
    p.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP (or gRPC) address")
    p.add_argument("--grpc", action="store_true", help="use gRPC instead of HTTP")
    p.add_argument("--model", default="demo", help="Triton model name (default: demo)")
    p.add_argument("--config", help="ps.json of the model (default: the one it is served from)")
    p.add_argument("--table", help="table of the keys (default: the model's first)")
    p.add_argument("--keys", help="comma-separated int64 keys (embedding models)")
    p.add_argument("--samples", type=int, default=2, help="random samples (CTR models)")
    p.set_defaults(func=_query)

    from hps.triton import install

    install.register(sub)


def _demo(args: argparse.Namespace) -> int:
    from hps.triton.demo import create_demo

    existed = (Path(args.dir) / "ps.json").exists() and not args.force
    path = create_demo(
        args.dir,
        num_tables=args.tables,
        max_rows=args.rows,
        dim=args.dim,
        instances=args.instances,
        force=args.force,
    )
    print(f"{'using existing' if existed else 'created'} demo model: {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import logging

    from hps.triton.deploy import serving_config
    from hps.triton.lifecycle import check_ports, clean_stale, owned_tempdir
    from hps.triton.output import TritonOutput
    from hps.triton.repository import prepare_repository, served_models
    from hps.triton.server import TritonServer

    verbose = bool(getattr(args, "verbose", False))
    if not verbose:  # a quiet start: what goes wrong, and the steps printed below
        logging.getLogger().setLevel(logging.WARNING)
    ports = {"HTTP": args.http_port, "gRPC": args.grpc_port, "metrics": args.metrics_port}
    check_ports(args.host, ports)  # before anything is written or printed
    for path in clean_stale():
        print(f"removed {path}, left by a dead hps serve", file=sys.stderr)
    if args.config is None:
        from hps.triton.demo import create_demo

        args.config = str(create_demo("demo"))
    config = serving_config(args.config)
    from hps.redact import protect
    from hps.updates.kafka import check_update_source

    protect(config)  # every log record scrubbed; the config's secrets registered
    check_update_source(config)  # a bad Kafka setting is a config error before any work
    tables = sum(len(m.tables) for m in config.models)
    print(
        f"hps serve: {args.config}: {_plural(len(config.models), 'model')}, "
        f"{_plural(tables, 'table')}",
        flush=True,
    )
    tmp = owned_tempdir("hps-repo-")
    try:
        repo = Path(args.repository or tmp)
        names = prepare_repository(config, repo, metrics_interval_s=args.metrics_interval)
        _import(config, verbose)
        key, key_file = _admin_key(args.state_dir or Path(args.config).resolve().parent, tmp)
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


def _repository(args: argparse.Namespace) -> int:
    from hps.triton.repository import prepare_repository, write_demo_repository

    if args.config is None:
        names = write_demo_repository(args.out)
    else:
        from hps.triton.deploy import serving_config

        config = serving_config(args.config)
        names = prepare_repository(config, args.out, relative=args.relative)
    for name in names:
        print(f"wrote {Path(args.out) / name}/config.pbtxt and 1/model.py")
    return 0


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _import(config: PSConfig, verbose: bool) -> None:
    """Bring L3 (and a shared L2) up to date with the sparse files: one line, or one per
    table (and a progress bar) when verbose."""
    import time

    from hps.triton.deploy import prepare_tables

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
    """The request-size gate's limit: derived from the config unless given; 0: no gate."""
    from hps.triton.gate import BodyLimit, find_nginx

    if max_request_mb is not None and max_request_mb <= 0:
        return None
    find_nginx()  # its absence is a ConfigError that says what to do, before any work
    if max_request_mb is None:
        return BodyLimit.for_config(config)
    return BodyLimit.of(int(max_request_mb * 2**20))


def _admin_key(state_dir: str | Path, fallback: Path) -> tuple[str, Path | None]:
    from hps.triton.admin import ensure_key

    try:
        return ensure_key(state_dir)
    except OSError:  # a read-only config folder: keep it beside the repository
        return ensure_key(fallback)


def _run(server: TritonServer, config: PSConfig, args: argparse.Namespace, key: Path | None) -> int:
    """Serve until Ctrl-C / SIGTERM (then drain: exit 0 if clean) or until Triton exits."""
    from hps.errors import HPSError
    from hps.triton.watchdog import Watchdog, probe_inputs

    watchdog = None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt
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
            probes = probe_inputs(config)
            assert server.proc is not None
            watchdog = Watchdog(
                server.http_url,
                server.admin_key,
                probes,
                interval=args.watchdog_interval,
                server_pid=server.proc.pid,
            )
            watchdog.start()
        _print_banner(server, config, args.config, key)
        name, status = server.wait()
        print(f"{name} exited by itself (status {status})", file=sys.stderr)
        return status if status > 0 else 1  # a signal's negative status is no exit code
    except KeyboardInterrupt:
        print("stopping: draining requests, then tritonserver", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the drain
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
    from hps.triton.repository import served_models

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


def _query(args: argparse.Namespace) -> int:
    from hps.triton.client import query

    for line in query(
        args.url,
        args.model,
        grpc=args.grpc,
        config=args.config,
        table=args.table,
        keys=args.keys,
        samples=args.samples,
    ):
        print(line)
    return 0


def _reload(args: argparse.Namespace) -> int:
    from hps.errors import ConfigError
    from hps.triton.admin import resolve_key
    from hps.triton.control import ModelControl

    state = args.state_dir or (Path(args.config).resolve().parent if args.config else None)
    key = resolve_key(state)
    if key is None:
        raise ConfigError(
            "no admin key: set HPS_ADMIN_KEY or HPS_ADMIN_KEY_FILE, or pass --config / --state-dir"
        )
    ModelControl(args.url, key, timeout=600.0).reload(args.model)
    print(f"reloaded {args.model}")
    return 0

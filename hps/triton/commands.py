"""``hps demo``, ``hps serve``, ``hps repository``, ``hps reload``, ``hps query``,
``hps install-triton``: the options, and a few lines each over the modules that do the work
(``hps serve``: :mod:`hps.triton.supervisor.serve`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from hps.cli import non_negative_float, port, positive_int
from hps.config.model import MAX_DIM, MAX_TABLES

DEFAULT_SAMPLES = 2


def _up_to(limit: int) -> Callable[[str], int]:
    """An argparse type: an integer from 1 to ``limit`` (what a ps.json allows)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be from 1 to {limit}, not {value}")
        return value

    return parse


def register(sub: argparse._SubParsersAction) -> None:
    what = "create a small synthetic CTR model to serve (if absent)"
    p = sub.add_parser("demo", help=what, description=what[0].upper() + what[1:] + ".")
    p.add_argument("--dir", default="demo", help="folder of the demo model (default: demo)")
    # No argparse defaults: an option given for an existing demo must match what it was
    # made with (hps.ctr.demo.DEFAULTS fill the others in for a new one).
    p.add_argument(
        "--tables",
        type=_up_to(MAX_TABLES),
        help=f"embedding tables, 1 to {MAX_TABLES} (default: 26)",
    )
    p.add_argument("--rows", type=positive_int, help="rows of the largest table (default: 100000)")
    p.add_argument(
        "--dim",
        type=_up_to(MAX_DIM),
        help=f"embedding vector size, 1 to {MAX_DIM} (default: 16)",
    )
    p.add_argument(
        "--instances", type=positive_int, help="Triton instances of the model (default: 1)"
    )
    p.add_argument(
        "--seed",
        type=int,
        help="of the vectors and dense weights (default: 0); another seed gives a stand-in "
        "for a retrain of the same keys, e.g. a model version to import (docs/versions.md)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing demo (without it, an existing demo is used as it is; "
        "options that differ from what it was made with are refused)",
    )
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "serve",
        help="serve a ps.json through Triton (default: the demo model)",
        description="Validate the config, import its sparse_files into L3 where needed, "
        "prepare a model repository and run tritonserver until Ctrl-C or SIGTERM.",
    )
    p.add_argument("--config", help="ps.json (default: create and serve demo/ps.json)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; 0.0.0.0: all)",
    )
    p.add_argument("--http-port", type=port, default=8000, help="HTTP port (default: 8000)")
    p.add_argument("--grpc-port", type=port, default=8001, help="gRPC port (default: 8001)")
    p.add_argument(
        "--metrics-port", type=port, default=8002, help="Prometheus metrics port (default: 8002)"
    )
    p.add_argument(
        "--repository",
        help="where to write the model repository (default: <L3 path>.hps-repository beside "
        "L3; no L3: <ps.json minus .json>.hps-repository with a shared L2, else a temporary "
        "folder; docs/serving.md)",
    )
    p.add_argument(
        "--metrics-interval",
        type=non_negative_float,
        default=1.0,
        help="seconds between the models' updates of /metrics (default: 1; 0: every request)",
    )
    p.add_argument(
        "--state-dir", help="where a generated admin key is kept (default: the ps.json's folder)"
    )
    p.add_argument(
        "--watchdog-interval",
        type=non_negative_float,
        default=2.0,
        help="seconds between probes (default: 2; 0: off)",
    )
    p.add_argument(
        "--max-request-mb",
        type=non_negative_float,
        help="largest gRPC request the request-size gate (nginx) lets through; HTTP 7.25x "
        "that, as JSON (default: the largest the models' key limits allow; 0: no gate, "
        "Triton listens itself; docs/security.md)",
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
    p.add_argument(
        "--url", default="127.0.0.1:8000", help="Triton HTTP address (default: 127.0.0.1:8000)"
    )
    p.add_argument("--model", default="demo", help="Triton model name (default: demo)")
    p.add_argument("--config", help="ps.json it is served from (finds the admin key file)")
    p.add_argument("--state-dir", help="folder of the admin key file, if not the ps.json's")
    p.set_defaults(func=_reload)

    p = sub.add_parser("query", help="send one request to a served model and print the answer")
    p.add_argument(
        "--url",
        default="127.0.0.1:8000",
        help="Triton HTTP (or gRPC) address (default: 127.0.0.1:8000)",
    )
    p.add_argument("--grpc", action="store_true", help="use gRPC instead of HTTP")
    p.add_argument("--model", default="demo", help="Triton model name (default: demo)")
    p.add_argument("--config", help="ps.json of the model (default: its served parameters)")
    p.add_argument("--table", help="table of the keys (default: the model's first)")
    p.add_argument("--keys", help="comma-separated int64 keys (embedding models)")
    p.add_argument(
        "--samples",
        type=positive_int,
        help=f"random samples (CTR models; default: {DEFAULT_SAMPLES})",
    )
    p.set_defaults(func=_query)

    from hps.triton.supervisor.install import PYTRITON_REQUIREMENT

    p = sub.add_parser(
        "install-triton",
        help=f"install tritonserver ({PYTRITON_REQUIREMENT}, --no-deps) into this environment",
        description="pip-install the nvidia-pytriton wheel without its requirements (it pins "
        "numpy<2 for an API HPS does not use), then check that tritonserver is found.",
    )
    p.add_argument("--force", action="store_true", help="install even if tritonserver is on PATH")
    p.add_argument("pip_args", nargs="*", metavar="PIP_ARG", help="extra pip options, after `--`")
    p.set_defaults(func=_install)


def _demo(args: argparse.Namespace) -> int:
    from hps.ctr.demo import DEFAULTS, create_demo, made_with
    from hps.errors import RequestError

    existed = (Path(args.dir) / "ps.json").exists() and not args.force
    given = {"tables": args.tables, "rows": args.rows, "dim": args.dim,
             "instances": args.instances, "seed": args.seed}  # fmt: skip
    if existed:
        made = made_with(args.dir)
        other = [
            f"--{k} {made[k]}" for k, v in given.items() if v is not None and made.get(k, v) != v
        ]
        if other:
            raise RequestError(
                f"{args.dir} holds a demo made with {', '.join(other)}, not what is asked: "
                "give another --dir, or --force to write it again"
            )
    asked = {k: DEFAULTS[k] if v is None else v for k, v in given.items()}
    path = create_demo(
        args.dir,
        num_tables=asked["tables"],
        max_rows=asked["rows"],
        dim=asked["dim"],
        instances=asked["instances"],
        seed=asked["seed"],
        force=args.force,
    )
    print(f"{'using existing' if existed else 'created'} demo model: {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from hps.triton.supervisor.serve import serve

    return serve(args)


def _repository(args: argparse.Namespace) -> int:
    from hps.triton.repository import prepare_repository, write_demo_repository

    if args.config is None:
        names = write_demo_repository(args.out)
    else:
        from hps.triton.serving import serving_config

        config = serving_config(args.config)
        names = prepare_repository(config, args.out, relative=args.relative)
    for name in names:
        print(f"wrote {Path(args.out) / name}/config.pbtxt and 1/model.py")
    return 0


def _query(args: argparse.Namespace) -> int:
    from hps.triton.client.query import parse_keys, query

    if args.keys is not None:
        parse_keys(args.keys)  # a RequestError before any connection
    _refuse_options_of_the_other_kind(args)
    for line in query(
        args.url,
        args.model,
        grpc=args.grpc,
        config=args.config,
        table=args.table,
        keys=args.keys,
        samples=args.samples or DEFAULT_SAMPLES,
    ):
        print(line)
    return 0


def _refuse_options_of_the_other_kind(args: argparse.Namespace) -> None:
    """A CTR model takes no --keys or --table, an embedding model no --samples: a
    RequestError before anything is sent, rather than an option silently ignored."""
    given = {"--keys": args.keys, "--table": args.table, "--samples": args.samples}
    if all(value is None for value in given.values()):
        return
    from hps.errors import RequestError
    from hps.triton.client import Client

    with Client(args.url, grpc=args.grpc) as client:
        ctr = "CATCOLUMN" in client.input_names(args.model)
    wrong = ("--keys", "--table") if ctr else ("--samples",)
    if used := [flag for flag in wrong if given[flag] is not None]:
        kind, takes = ("a CTR", "--samples N") if ctr else ("an embedding", "--keys K1,K2,...")
        raise RequestError(f"{' and '.join(used)}: {args.model} is {kind} model; it takes {takes}")


def _reload(args: argparse.Namespace) -> int:
    from hps.errors import ConfigError
    from hps.triton.admin_key import resolve_key
    from hps.triton.client import ModelControl

    state = args.state_dir or (Path(args.config).resolve().parent if args.config else None)
    key = resolve_key(state)
    if key is None:
        raise ConfigError(
            "no admin key: set HPS_ADMIN_KEY or HPS_ADMIN_KEY_FILE, or pass --config / --state-dir"
        )
    ModelControl(args.url, key, timeout=600.0).reload(args.model)
    print(f"reloaded {args.model}")
    return 0


def _install(args: argparse.Namespace) -> int:
    from hps.triton.supervisor.install import install_triton

    print(install_triton(args.pip_args, force=args.force))
    return 0

"""``hps versions list|activate|retire`` and ``hps import --version N`` (its work).

A few lines each over the core (:mod:`hps.versions`, :func:`hps.triton.activation.activate`)
and the report the control plane answers ``GET /v1/models/{model}/versions`` with
(:mod:`hps.service.version_report`). The ps.json is read as ``hps serve`` reads it
(:func:`hps.triton.serving.serving_config`: relative paths from the current folder), so
the paths recorded with a version are absolute.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hps.config import PSConfig

DESCRIPTION = """\
A model version is an immutable snapshot of a model's tables and dense weights, a Triton
model version: `hps import --version N` imports one beside the live one; `activate N` makes
it live (Triton loads it, warm, then sends unversioned requests to it; older kept versions
stay served for clients that pin one); activating a kept older version is a rollback, with
no import; `retire N` drops a version's rows in every tier. hps_keep_versions (ps.json,
default 2) versions up to the live one are kept and served: the live one, the one live
before it, then the newest others; versions imported above the live one are kept too, not
served; activating retires the rest.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "versions",
        help="list, activate (roll back), retire and roll out (over pods) model versions",
        description=DESCRIPTION,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str, version: bool) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help, description=help)
        a.add_argument("--config", required=True, help="ps.json (the one `hps serve` serves)")
        a.add_argument("--model", required=True, help="model name (a ps.json `model`)")
        if version:
            a.add_argument("version", type=positive, metavar="N", help="model version")
        return a

    a = action("list", "one line per version: state, created, rows and bytes per tier", False)
    a.add_argument("--exact", action="store_true", help="count L3's rows exactly (a key scan)")
    a.set_defaults(func=_list)

    a = action(
        "activate",
        "make version N live on the running `hps serve` (a rollback when N is older)",
        True,
    )
    a.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP address of hps serve")
    a.add_argument("--state-dir", help="folder of the admin key file, if not the ps.json's")
    a.add_argument(
        "--repository",
        help="the model repository hps serve serves (default: the one it writes beside the "
        "node's L3 or state, <l3 path>.hps-repository)",
    )
    a.set_defaults(func=_activate)

    a = action(
        "retire",
        "drop version N's rows in every tier (not the live one nor a served one); again for "
        "a retired version whose rows were left (a drop that failed)",
        True,
    )
    a.set_defaults(func=_retire)

    from hps.commands.rollout import add_rollout  # over the pods' control planes, no ps.json

    add_rollout(actions)


def positive(text: str) -> int:
    """A model version on the command line: an integer in ``[1, MAX_VERSION]``."""
    from hps.types import MAX_VERSION

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a model version: {text!r}") from None
    if not 1 <= value <= MAX_VERSION:
        raise argparse.ArgumentTypeError(
            f"model versions are integers from 1 to {MAX_VERSION:,}, not {value}"
        )
    return value


def _config(path: str) -> PSConfig:
    from hps.triton.serving import serving_config

    return serving_config(path)


def _list(args: argparse.Namespace) -> int:
    from hps.service.version_report import declare, declared, versions_report
    from hps.tiers import Tiers
    from hps.topology import topology

    config = _config(args.config)
    config.model(args.model)  # an unknown model says so before any tier is opened
    shared_l2 = topology(config).l2 not in (None, "process")
    tiers = Tiers.open(config, l3_mode="read_only", l2=shared_l2)
    try:
        declare(tiers, *declared(config))
        report = versions_report(config, args.model, tiers, args.exact)
    finally:
        tiers.close()
    for line in report_lines(report):
        print(line)
    return 0


def _shape(version: dict[str, Any]) -> str:
    """``dims 16/32 float16``: the tables' dims and row formats (one when all share it)."""
    dims, dtypes = version.get("dims") or [], version.get("row_dtypes") or []
    dims = dims[:1] if len(set(dims)) == 1 else dims
    formats = dtypes[:1] if len(set(dtypes)) == 1 else dtypes
    return f"dims {'/'.join(map(str, dims))} {'/'.join(formats)}"


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report as ``hps versions list`` prints it: one line per version."""
    estimated = set(report["rows_estimated"])
    lines = []
    for v in report["versions"]:
        created = v["created"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) if created else "-"
        tiers = []
        for tier in ("l2", "l3"):
            rows, nbytes = v["rows"][tier], v["bytes"][tier]
            if rows is None:
                tiers.append(f"{tier} -")
            else:
                about = "~" if tier in estimated else ""
                tiers.append(f"{tier} {about}{rows} rows {_size(nbytes)}")
        served = "served" if v["served"] else "      "
        left = "  rows left: retire it again" if v.get("rows_left") else ""
        if v.get("shared_rows_left"):
            left += "  shared L2 rows kept: another node holds it"
        lines.append(
            f"{report['model']} {v['version']:>4}  {v['state']:<7}  {served}  "
            f"created {when:<19}  {'  '.join(tiers)}  {_shape(v)}{left}"
        )
    return lines


def _size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"({size:.0f} B)" if unit == "B" else f"({size:.1f} {unit})"
        size /= 1024
    return f"({size:.1f} GiB)"


def _activate(args: argparse.Namespace) -> int:
    from hps.errors import ConfigError
    from hps.loading.imports import repository_dir
    from hps.triton.activation import activate
    from hps.triton.admin_key import resolve_key
    from hps.triton.client import ModelControl

    config = _config(args.config)
    config.model(args.model)
    repository = Path(args.repository) if args.repository else repository_dir(config)
    if repository is None or not repository.is_dir():
        raise ConfigError(
            f"no model repository of hps serve at {repository or '(none: no state folder)'}; "
            "pass --repository (the one hps serve --repository names)"
        )
    key = resolve_key(args.state_dir or Path(args.config).resolve().parent)
    if key is None:
        raise ConfigError(
            "no admin key: set HPS_ADMIN_KEY or HPS_ADMIN_KEY_FILE, or pass --state-dir"
        )
    control = ModelControl(args.url, key, timeout=600.0)
    done = activate(config, args.model, args.version, control, repository)
    retired = ", ".join(map(str, done.retired)) or "none"
    print(
        f"{done.model}: version {done.live} live (was {done.previous}); Triton serves "
        f"{', '.join(map(str, done.served))}; retired: {retired}"
    )
    if done.rows_left:
        left = ", ".join(map(str, done.rows_left))
        print(
            f"{done.model}: the rows of retired version(s) {left} are not dropped yet "
            f"({done.problem}); `hps versions retire` them again to drop them"
        )
    return 0


def _retire(args: argparse.Namespace) -> int:
    from hps.versions import VersionRegistry
    from hps.versions.rollout import retire

    config = _config(args.config)
    retire(config, args.model, args.version)
    kept = VersionRegistry(config).get(args.model, args.version).shared_rows_left
    where = (
        "dropped but in the shared L2, kept while another node holds it"
        if kept
        else "dropped in every tier"
    )
    print(f"{args.model}: version {args.version} retired (its rows {where})")
    return 0


def import_version(args: argparse.Namespace) -> int:
    """``hps import --version N``: import a new version of ``--model`` beside the live one."""
    from hps.versions.rollout import import_version as import_core
    from hps.versions.rollout import version_entry

    config = _config(args.config)
    entry = version_entry(
        config,
        args.model,
        sparse_files=args.sparse_files,
        dense_file=args.dense_file,
        row_dtype=args.row_dtype,
        dims=args.dims,
    )
    rows = import_core(config, entry, args.version, progress=not args.quiet)
    for table, n in rows.items():
        print(f"{table}: {n} rows")
    print(
        f"{args.model}: version {args.version} ready; make it live with: hps versions "
        f"activate --config {args.config} --model {args.model} {args.version}"
    )
    return 0

"""``hps import``, ``hps export`` and ``hps lookup`` (``hps import --version``:
:mod:`hps.commands.versions`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hps.cli import int64

if TYPE_CHECKING:
    from hps.config import PSConfig
    from hps.lookup import LookupSession
    from hps.tiers import AccessMode
    from hps.types import TableSpec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="load tables into L3 (and L2 per initial_cache_rate); a new model version",
        description="Without --table: every model's sparse_files. With --table: one table "
        "from --sparse DIR or --npy KEYS VECTORS. With --model M --version N: version N of "
        "model M, beside the live one (its own namespace in every tier; nothing served "
        "changes), from --sparse-files (default: the ps.json entry's) and --dense-file, in "
        "--row-dtype and --dims (default: the ps.json entry's, which describes version 1: "
        "leave it as version 1 was imported); then `hps versions activate` makes it live.",
    )
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--table", help="<model>.<table>")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sparse", metavar="DIR", help="HugeCTR sparse-model folder")
    src.add_argument("--npy", nargs=2, metavar=("KEYS", "VECTORS"), help=".npy key/vector pair")
    p.add_argument(
        "--force",
        action="store_true",
        help="import even tables whose files L3 already holds; a table stored in another "
        "row format or dimension (hps_row_dtype changed) is dropped in every tier and "
        "imported in the configured one",
    )
    p.add_argument("--model", help="the model a new --version is of")
    p.add_argument(
        "--version", type=positive_version, metavar="N", help="import a new model version N"
    )
    p.add_argument(
        "--sparse-files",
        nargs="+",
        metavar="DIR",
        help="with --version: one HugeCTR sparse-model folder per table, in table order",
    )
    p.add_argument("--dense-file", metavar="F", help="with --version: the dense weights")
    p.add_argument(
        "--row-dtype",
        nargs="+",
        metavar="DTYPE",
        help="with --version: how every tier stores the version's rows (float32, float16, "
        "int8), one for every table or one per table (default: the ps.json entry's "
        "hps_row_dtype, which describes version 1)",
    )
    p.add_argument(
        "--dims",
        nargs="+",
        type=int,
        metavar="DIM",
        help="with --version: the version's vector sizes, one for every table or one per "
        "table (default: the ps.json entry's embedding_vecsize_per_table); a CTR model's "
        "--dense-file must take them",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_import)

    p = sub.add_parser(
        "export",
        help="write a table from L3 (or L2) to files",
        description="Writes float32 vectors (decoded from the table's hps_row_dtype), which "
        "hps import reads back. --raw writes the rows as stored instead.",
    )
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--table", required=True, help="<model>.<table>")
    dst = p.add_mutually_exclusive_group(required=True)
    dst.add_argument("--sparse", metavar="DIR", help="HugeCTR sparse-model folder")
    dst.add_argument("--npy", nargs=2, metavar=("KEYS", "VECTORS"), help=".npy key/vector pair")
    p.add_argument(
        "--raw",
        action="store_true",
        help="write the stored rows, not float32: HugeCTR's key/emb_vector layout (or the "
        ".npy pair) with each row's stored bytes: float32 x dim, float16 x dim, or for int8 "
        "dim uint8 codes then the row's float32 scale and offset (dim + 8 bytes, FBGEMM's "
        "8-bit rowwise layout); not readable by hps import",
    )
    p.set_defaults(func=_export)

    p = sub.add_parser("lookup", help="print the vectors of keys (through L2, L3, defaults)")
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--table", required=True, help="<model>.<table>")
    p.add_argument("keys", nargs="+", type=int64, help="int64 keys")
    p.add_argument("--json", action="store_true", help="one JSON object per key")
    p.set_defaults(func=_lookup)


def _session(config: PSConfig, l3_mode: AccessMode = "read_write") -> LookupSession:
    """A session over each model's live version (version 1 unless another was activated)."""
    from hps.build import build_session
    from hps.versions import VersionRegistry

    _live_versions(config)  # a model with none: a RequestError
    live = VersionRegistry(config).live_config()
    return build_session(live, with_cache=False, l3_mode=l3_mode)


def _table(session: LookupSession, name: str) -> TableSpec:
    """The session's table called ``name`` (``<model>.<table>``, at its live version)."""
    from hps.validate import table_or_raise

    return table_or_raise({s.qualified: s for s in session.tables.values()}, name)


def positive_version(text: str) -> int:
    from hps.commands.versions import positive

    return positive(text)


VERSION_OPTIONS = ("--model", "--sparse-files", "--dense-file", "--row-dtype", "--dims")


def _version_args(args: argparse.Namespace) -> bool:
    """Whether this is ``hps import --version``; RequestError for a mix that means nothing."""
    from hps.errors import RequestError

    given = {
        "--model": args.model,
        "--sparse-files": args.sparse_files,
        "--dense-file": args.dense_file,
        "--row-dtype": args.row_dtype,
        "--dims": args.dims,
        "--table": args.table,
        "--sparse": args.sparse,
        "--npy": args.npy,
        "--force": args.force or None,
    }
    used = [flag for flag, value in given.items() if value is not None]
    if args.version is None:
        versioned = [f for f in used if f in VERSION_OPTIONS]
        if versioned:
            raise RequestError(f"{' and '.join(versioned)}: only with --version N")
        return False
    if args.model is None:
        raise RequestError("--version needs --model (the model it is a version of)")
    other = [f for f in used if f in ("--table", "--sparse", "--npy", "--force")]
    if other:
        raise RequestError(f"--version imports a whole model version: not with {', '.join(other)}")
    return True


def _import(args: argparse.Namespace) -> int:
    from hps.config import load_config
    from hps.errors import RequestError

    if _version_args(args):
        from hps.commands.versions import import_version

        return import_version(args)
    from hps.loading.imports import import_tables, sparse_sources
    from hps.loading.loader import TableSource, npy_source, sparse_source
    from hps.topology import check_shared_l2_tables, topology
    from hps.validate import table_or_raise

    config = load_config(args.config)  # its L2 as hps serve opens it (hps.config)
    check_shared_l2_tables(config)  # refused before anything is written, as by hps serve
    live = _live_versions(config)
    sources: list[TableSource]
    if args.table is None:
        if args.sparse or args.npy:
            raise RequestError("--sparse/--npy need --table")
        moved = [f"{m} (version {n} is live)" for m, n in live.items() if n != 1]
        if moved:  # its files may be a retrain by now: version 1 is a snapshot kept as it was
            raise RequestError(
                f"{', '.join(moved)}: the ps.json's files are version 1's, kept for rollback "
                "as imported; import a retrained model as a new version (--model M "
                "--version N), or one table into the live version (--table)"
            )
        if args.force:
            _check_recorded_format(config)
        sources = sparse_sources(config)
    else:
        from hps.versions import VersionRegistry

        registry = VersionRegistry(config)
        tables = {  # the live version's tables, named as in the ps.json (model.table)
            t.qualified: t for m, n in live.items() for t in registry.model_at(m, n).tables
        }
        spec = table_or_raise(tables, args.table)
        if args.sparse:
            sources = [sparse_source(spec, args.sparse)]
        elif args.npy:
            sources = [npy_source(spec, *args.npy)]
        else:
            raise RequestError("--table needs --sparse DIR or --npy KEYS VECTORS")
    topo = topology(config)
    if topo.state_dir is None:  # import_tables would do nothing: say so, not "unchanged"
        nowhere = (
            f"no L3 (persistent_db disabled) and no shared L2 (volatile_db "
            f"{config.volatile_db.type}): "
            + (
                "each serving process loads its own L2 from the sparse_files when it starts"
                if topo.l2 == "process"
                else "no tier stores tables outside the serving processes"
            )
        )
        if args.table is not None:
            raise RequestError(f"{args.table}: nothing to import into: {nowhere}")
        print(f"nothing to import: {nowhere}")
        return 0
    done = import_tables(config, topo, sources, force=args.force, progress=not args.quiet)
    for source in sources:
        rows = done.get(source.spec.name)
        state = f"{rows} rows" if rows is not None else "unchanged (already imported)"
        print(f"{source.spec.name}: {state}")
    return 0


def _check_recorded_format(config: PSConfig) -> None:
    """RequestError (before anything is dropped) when a model's version record keeps version
    1 in another row format or dims than its ps.json entry now gives: every reader takes the
    recorded entry, so a forced re-import in the ps.json's format would make it unreadable."""
    from hps.config import ModelConfig
    from hps.errors import RequestError
    from hps.versions import VersionRegistry

    registry = VersionRegistry(config)
    recorded = set(registry.recorded_models())
    for model in config.models:
        if model.model not in recorded:
            continue
        first = [v for v in registry.versions(model.model) if v.version == 1]
        if not first:
            continue
        kept = ModelConfig.model_validate(first[0].entry)

        def shape(entry: ModelConfig) -> list[str]:
            return [f"{t.table} {t.row_dtype} x {t.dim}" for t in entry.tables]

        if shape(kept) != shape(model):
            raise RequestError(
                f"model {model.model!r}: version 1 is recorded ({registry.path}) with tables "
                f"{', '.join(shape(kept))}, the ps.json's entry now gives "
                f"{', '.join(shape(model))}: --force re-imports only in version 1's recorded "
                "format; import the new files as a new version (hps import --model "
                f"{model.model} --version N, then hps versions activate; see docs/versions.md), "
                "or restore the ps.json's row format and dims"
            )


def _live_versions(config: PSConfig) -> dict[str, int]:
    """Each ps.json model's live version (1 where nothing else was activated); a model with
    none (its record broken by hand) is a RequestError."""
    from hps.errors import RequestError, UnknownTableError
    from hps.versions import VersionRegistry

    registry = VersionRegistry(config)
    live: dict[str, int] = {}
    for m in config.models:
        try:
            live[m.model] = registry.live(m.model)
        except UnknownTableError as exc:
            raise RequestError(f"{exc}: see hps versions list") from None
    return live


def _export(args: argparse.Namespace) -> int:
    from hps.config import load_config
    from hps.errors import RequestError
    from hps.io.npy import NpyPairWriter
    from hps.io.sparse_model import SparseModelWriter
    from hps.io.table_files import TableWriter

    config = load_config(args.config)
    _check_offline_copy(config, "export from")
    if args.npy and Path(args.npy[0]).resolve() == Path(args.npy[1]).resolve():
        raise RequestError(f"--npy {args.npy[0]} {args.npy[1]}: name two different files")
    for dst in [args.sparse] if args.sparse else args.npy:
        _check_outside_state(config, dst)
    session = _session(config, "read_only")
    try:
        spec = _table(session, args.table)
        fmt = spec.fmt
        dtype, width = (fmt.dtype, spec.width) if args.raw else (np.dtype(np.float32), spec.dim)
        writer: TableWriter = (
            SparseModelWriter(args.sparse, dtype)
            if args.sparse
            else NpyPairWriter(args.npy[0], args.npy[1], dtype, width)
        )
        # one path: each dumped chunk written as stored (--raw) or decoded to float32; the
        # files replace the paths only once complete
        with writer:
            for keys, rows in session.tiers.dump(spec.name):
                writer.write(keys, rows if args.raw else fmt.decode(rows, spec.dim))
        form = f"stored {fmt.name} rows" if args.raw else "float32"
        print(f"{args.table}: {writer.rows} rows ({form})")
        return 0
    finally:
        session.close()


def _check_outside_state(config: PSConfig, dst: str) -> None:
    """RequestError when an export destination is inside L3's folder or one of the files and
    folders the node keeps beside it (``<L3 path>.hps-*``): writing there would damage them."""
    from hps.errors import RequestError
    from hps.topology import topology

    topo = topology(config)
    if topo.state_dir is None:
        return
    state = topo.state_dir.resolve()
    target = Path(dst).resolve()
    kept = [state] if topo.l3 else []
    kept += [p for p in [target, *target.parents] if p.parent == state.parent
             and p.name.startswith(f"{state.name}.hps-")]  # fmt: skip
    for folder in kept:
        if target == folder or folder in target.parents:
            what = "L3's database" if folder == state else "the node's state beside L3"
            raise RequestError(
                f"{dst}: inside {folder} ({what}): export to a path outside {state} and "
                f"{state}.hps-*"
            )


def _check_offline_copy(config: PSConfig, what: str) -> None:
    """RequestError unless a tier outside the serving processes holds the tables (L3, or a
    shared L2): an in-process L2 is each serving process's own, and this one's is empty."""
    from hps.errors import RequestError
    from hps.topology import topology

    topo = topology(config)
    if not topo.l3 and topo.l2 not in ("node", "server"):
        raise RequestError(
            f"nothing to {what}: no L3 (persistent_db disabled) and no shared L2 (Redis "
            "or multi_process_hash_map), so no process but a serving one holds the tables"
        )


def _lookup(args: argparse.Namespace) -> int:
    from hps.config import load_config

    config = load_config(args.config)
    _check_offline_copy(config, "look up in")
    session = _session(config, "read_only")
    try:
        keys = np.asarray(args.keys, dtype=np.int64)
        vectors = session.lookup(_table(session, args.table).name, keys)
        for key, vec in zip(keys.tolist(), vectors.tolist(), strict=True):
            if args.json:
                print(json.dumps({"key": key, "vector": vec}))
            else:
                print(key, " ".join(f"{x:.6g}" for x in vec))
        sys.stdout.flush()
        return 0
    finally:
        session.close()

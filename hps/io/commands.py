"""``hps import``, ``hps export`` and ``hps lookup``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hps.config import PSConfig
    from hps.lookup import LookupSession


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="load tables into L3 (and L2 per initial_cache_rate)",
        description="Without --table: every model's sparse_files. With --table: one table "
        "from --sparse DIR or --npy KEYS VECTORS.",
    )
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--table", help="<model>.<table>")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sparse", metavar="DIR", help="HugeCTR sparse-model folder")
    src.add_argument("--npy", nargs=2, metavar=("KEYS", "VECTORS"), help=".npy key/vector pair")
    p.add_argument("--force", action="store_true", help="re-import tables L3 already holds")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_import)

    p = sub.add_parser("export", help="write a table from L3 (or L2) to files")
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--table", required=True, help="<model>.<table>")
    dst = p.add_mutually_exclusive_group(required=True)
    dst.add_argument("--sparse", metavar="DIR", help="HugeCTR sparse-model folder")
    dst.add_argument("--npy", nargs=2, metavar=("KEYS", "VECTORS"), help=".npy key/vector pair")
    p.set_defaults(func=_export)

    p = sub.add_parser("lookup", help="print the vectors of keys (through L2, L3, defaults)")
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--table", required=True, help="<model>.<table>")
    p.add_argument("keys", nargs="+", type=int, help="int64 keys")
    p.add_argument("--json", action="store_true", help="one JSON object per key")
    p.set_defaults(func=_lookup)


def _session(config_path: str, **kw: Any) -> tuple[PSConfig, LookupSession]:
    from hps.build import build_session
    from hps.config import load_config

    config = load_config(config_path)
    return config, build_session(config, with_cache=False, **kw)


def _import(args: argparse.Namespace) -> int:
    from hps.errors import RequestError
    from hps.io.importer import import_chunks, import_model, import_sparse_model
    from hps.io.npy import npy_rows, read_npy_pair

    config, session = _session(args.config)
    rate = config.volatile_db.initial_cache_rate
    progress = not args.quiet
    try:
        if args.table is None:
            if args.sparse or args.npy:
                raise RequestError("--sparse/--npy need --table")
            for model in config.models:
                done = import_model(
                    session,
                    model,
                    initial_cache_rate=rate,
                    only_missing=not args.force,
                    progress=progress,
                )
                for table, rows in done.items():
                    print(f"{table}: {rows} rows")
            return 0
        spec = session.tables.get(args.table)
        if spec is None:
            from hps.errors import UnknownTableError

            raise UnknownTableError(
                f"unknown table {args.table!r}; known: {sorted(session.tables)}"
            )
        if args.sparse:
            rows = import_sparse_model(
                session, spec, args.sparse, initial_cache_rate=rate, progress=progress
            )
        elif args.npy:
            keys_path, vectors_path = args.npy
            total = npy_rows(keys_path, vectors_path, spec.dim)
            chunks = read_npy_pair(keys_path, vectors_path, spec.dim)
            rows = import_chunks(
                session, spec, chunks, total, initial_cache_rate=rate, progress=progress
            )
        else:
            raise RequestError("--table needs --sparse DIR or --npy KEYS VECTORS")
        print(f"{spec.name}: {rows} rows")
        return 0
    finally:
        session.close()


def _export(args: argparse.Namespace) -> int:
    from hps.errors import RequestError
    from hps.io.npy import write_npy_pair
    from hps.io.sparse_model import SparseModelWriter

    _, session = _session(args.config, persistent_mode="read_only")
    try:
        store = session.persistent or session.volatile
        if store is None or not hasattr(store, "dump"):
            raise RequestError("export needs an L3 (rocks_db) or an L2 that can list its rows")
        if args.table not in session.tables:
            from hps.errors import UnknownTableError

            raise UnknownTableError(f"unknown table {args.table!r}")
        rows = 0
        if args.sparse:
            with SparseModelWriter(args.sparse) as w:
                for keys, vecs in store.dump(args.table):
                    w.write(keys, vecs)
                rows = w.rows
        else:
            parts = list(store.dump(args.table))
            dim = session.tables[args.table].dim
            keys = np.concatenate([k for k, _ in parts]) if parts else np.empty(0, np.int64)
            vecs = (
                np.concatenate([v for _, v in parts]) if parts else np.empty((0, dim), np.float32)
            )
            write_npy_pair(args.npy[0], args.npy[1], keys, vecs)
            rows = keys.size
        print(f"{args.table}: {rows} rows")
        return 0
    finally:
        session.close()


def _lookup(args: argparse.Namespace) -> int:
    _, session = _session(args.config, persistent_mode="read_only")
    try:
        keys = np.asarray(args.keys, dtype=np.int64)
        vectors = session.lookup(args.table, keys)
        for key, vec in zip(keys.tolist(), vectors.tolist(), strict=True):
            if args.json:
                print(json.dumps({"key": key, "vector": vec}))
            else:
                print(key, " ".join(f"{x:.6g}" for x in vec))
        sys.stdout.flush()
        return 0
    finally:
        session.close()

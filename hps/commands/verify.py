"""``hps verify``: read every L3 table with checksums verified and name the damaged ones."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check every L3 (RocksDB) table's checksums; exit 1 naming the damaged ones",
        description="Reads every column family of the ps.json's persistent_db whole, each "
        "block's checksum verified (and, for the configured tables, each row's length), "
        "through a secondary instance: it may run beside hps serve and hps consume, and on "
        "a read-only volume. Exit status 0: every table intact; 1: some table damaged "
        "(hps import --force drops its damaged files and imports it again); 2: L3 could not "
        "be opened. See docs/reliability.md.",
    )
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument("--json", action="store_true", help="one JSON object per table")
    p.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from hps.errors import ConfigError
    from hps.tiers import Tiers
    from hps.triton.serving import serving_config

    config = serving_config(args.config)
    if config.persistent_db.type == "disabled":
        raise ConfigError(f"{args.config}: no persistent_db (L3) to verify")
    tiers = Tiers.open(config, l3_mode="secondary", l2=False)
    try:
        tiers.open_tables(config.tables)
        checks = tiers.verify_l3()
    finally:
        tiers.close()
    for c in checks:
        if args.json:
            print(json.dumps({"table": c.name, "ok": c.ok, "rows": c.rows, "problem": c.problem}))
            continue
        label = f"{c.name} (the tables' recorded formats)" if c.name == "default" else c.name
        if c.ok:
            print(f"ok       {label}: {c.rows:,} rows")
        else:
            print(f"DAMAGED  {label}: {c.problem} (after {c.rows:,} rows)")
    damaged = [c.name for c in checks if not c.ok]
    if not args.json:
        path = config.persistent_db.path
        verdict = f"damaged: {', '.join(damaged)}" if damaged else "intact"
        print(f"L3 {path}: {len(checks)} column families, {verdict}")
    return 1 if damaged else 0

"""``hps plan`` (memory per tier, before loading) and ``hps freq`` (a frequency file from a log)."""

from __future__ import annotations

import argparse

from hps.cli import non_negative_int
from hps.errors import ConfigError

MAX_ROWS = 2**40
"""The most rows ``--rows`` takes for a table (far beyond any one node's memory)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="print what runs where and the memory each tier takes per table, before loading",
        description="Each model is planned at its live version (the entry recorded for it: "
        "files, dims, row formats; the ps.json's own where no other version was activated). "
        "Table rows come from the sizes of the sparse-model files (nothing is "
        "read) or from --rows. Each table's rows are sized in its row format (hps_row_dtype: "
        "'row B' is one stored row), with totals per format. L1 is exact; L2/L3 use each "
        "backend's per-row cost (docs/cache.md); the L2 is the one hps serve opens "
        "(multi_process_hash_map where a model has several instances and volatile_db names "
        "no type), whose segment's fixed bytes (header, table entries) count once, and "
        "models needing more of its table entries than it has are refused, as is an L2 "
        "planned beyond its shared_memory_size without L3 (a warning line with L3). L2 holds "
        "initial_cache_rate x rows beside an L3 (every row without one), at most "
        "overflow_margin (x num_partitions for Redis); with Kafka updates and no L3 the "
        "update-version side tables are a column of their own (L2 side). A table whose L1 "
        "capacity is over twice its rows gets a note line. "
        "A model whose L1 is or may be on a GPU "
        "(hps_cache.device cupy or auto) gets a line of its GPU memory per instance: the "
        "caches and the staging buffers of the host path for a request of the configured "
        "size, device memory apart from pinned host memory.",
    )
    p.add_argument("--config", required=True, help="ps.json")
    p.add_argument(
        "--rows",
        action="append",
        default=[],
        metavar="MODEL.TABLE=N",
        help="rows of a table without sparse files, at most 2**40 (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_plan)

    p = sub.add_parser(
        "freq",
        help="count an access log into a frequency file for warm-up (hps_cache.frequency_file)",
    )
    p.add_argument("log", help="access log: raw int64 keys, one per access (keyset format)")
    p.add_argument("--out", required=True, help="frequency file to write (.npz: keys, counts)")
    p.add_argument(
        "--top", type=non_negative_int, default=0, help="keep only the N hottest keys (0: all)"
    )
    p.set_defaults(func=_freq)


def parse_rows(items: list[str]) -> dict[str, int]:
    rows: dict[str, int] = {}
    for item in items:
        name, _, n = item.partition("=")
        try:
            rows[name] = int(n)
        except ValueError:
            raise ConfigError(f"--rows {item!r}: expected MODEL.TABLE=N") from None
        if not 0 <= rows[name] <= MAX_ROWS:
            raise ConfigError(f"--rows {item!r}: rows must be >= 0 and at most 2**40")
    return rows


def _plan(args: argparse.Namespace) -> int:
    from hps.config import load_config
    from hps.plan import (
        check_l2_segment,
        format_text,
        gpu_lines,
        l1_gpu,
        l1_notes,
        l2_segment_bytes,
        l3_memory,
        plan,
        to_json,
        version_costs,
    )
    from hps.topology import check_shared_l2_tables, describe, shared_l2_versions_note, topology
    from hps.versions import VersionRegistry

    # read as hps serve reads it (the L2 of several instances: hps.config), and refused
    # where serving would be
    config = VersionRegistry(load_config(args.config)).live_config()
    check_shared_l2_tables(config)
    plans, topo = plan(config, parse_rows(args.rows)), topology(config)
    versions = version_costs(config, plans)
    if crowded := shared_l2_versions_note(config):
        versions.append(crowded)
    gpus = l1_gpu(config, plans)
    segment = l2_segment_bytes(config)
    warnings = [w] if (w := check_l2_segment(config, plans)) else []
    notes = l1_notes(plans)
    if args.json:
        print(to_json(plans, topo, versions, gpus, segment, notes, warnings))
    else:
        l3 = [n] if (n := l3_memory(config)) else []
        table = format_text(plans, segment)
        lines = [*describe(topo), "", table, *gpu_lines(gpus), *l3, *notes, *versions, *warnings]
        print("\n".join(lines))
    return 0


def _freq(args: argparse.Namespace) -> int:
    import numpy as np

    from hps.io.frequency import count_access_log, write_frequency_file

    keys, counts = count_access_log(args.log)
    if 0 < args.top < keys.size:
        top = np.argpartition(-counts, args.top - 1)[: args.top]
        keys, counts = keys[top], counts[top]
    write_frequency_file(args.out, keys, counts)
    print(f"{args.out}: {keys.size} keys, {int(np.sum(counts))} accesses")
    return 0

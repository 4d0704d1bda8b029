"""``hps plan``: what runs where, and the memory each tier will take per table, before loading.

HugeCTR users could not predict it (HugeCTR issue 427). The naive sizing rule is
``unique keys x vector size x sizeof(float)``; the real cost is each table's stored row (its
``hps_row_dtype``, :mod:`hps.rowformat`: float32 ``4 x dim`` bytes, float16 ``2 x dim``,
int8 ``dim + 8``) plus each tier's per-row overhead, which each backend declares
(:func:`hps.tiers.bytes_per_row`, given the format):

- L1: :func:`hps.cache.cache_nbytes` (arena + row metadata + index + policy state + the
  write log's rings; the log's entries are host memory even for a GPU cache), exact,
  for each cache; every Triton instance is a process with its own caches (the instances of
  the embedding model, and as many of the CTR model where there is one:
  ``ModelConfig.processes``): with ``hps_cache.device: cupy`` in device memory, each
  Triton model's instances spread round robin over the ``deployed_device_list``
  (``ModelConfig.instance_gpus``); with ``auto`` all on its first GPU where the start-up
  calibration picks CuPy (:mod:`hps.cache.auto`), else in host memory, as with NumPy. A model whose
  L1 is or may be on a GPU also gets an :class:`L1GpuPlan`: per instance, its caches and the
  staging buffers for a request of the configured size, device memory apart from pinned
  host memory (:func:`hps.cache.gpu_request.request_staging`, the sizing the buffers grow
  by; one set per process and GPU, shared by its caches: :func:`hps.cache.device.gpu_device`):
  those of the host path for ``auto``'s ``KIND_CPU`` instances, those of rows kept on the
  GPU for ``cupy``'s ``KIND_GPU`` ones (which answer there) and for CTR instances.
- L2: the in-process ``hash_map``'s own ``bytes_per_row``; the shared
  ``multi_process_hash_map``'s whole extents of its segment (``table_bytes``: at least one
  of rows and one bucket a table, 16 MiB each with the default segment), and once per node
  the segment's fixed bytes before its extents (header, free-extent stack, table entries:
  :func:`l2_segment_bytes`, from the geometry the segment lays itself out by); for Redis an
  estimate of its hash encoding (field, value and dict entry, rounded to jemalloc size
  classes; a sorted-set entry more when ``overflow_margin`` is set). ``hash_map`` lives in
  each instance process, so it counts once per instance. Rows: :func:`l2_rows`; with Kafka
  updates and no L3 the update-version side tables beside each table
  (:func:`l2_side_bytes`); a planned L2 beyond a segment's ``shared_memory_size`` is refused
  without L3, a warning with one (:func:`check_l2_segment`).
- L3: a RocksDB estimate: key, value and ~16 bytes of per-entry SST overhead, x 1.1 for
  leveled compaction's space amplification, on disk.

Table rows come from the sizes of the sparse-model files (nothing is read), or from
``--rows model.table=N``. Totals are given per row format as well as overall.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from hps.cache import MIN_CAPACITY, cache_capacity, cache_nbytes
from hps.cache.calibrate import request_keys
from hps.cache.gpu_request import request_staging
from hps.config import ModelConfig, PersistentDBConfig, PSConfig, VolatileDBConfig
from hps.config.segment import MAX_TABLES, segment_geometry
from hps.errors import ConfigError
from hps.rowformat import FLOAT32, ROW_DTYPES, RowFormat
from hps.tiers import bytes_per_row, table_bytes
from hps.tiers.side_tables import LIMBS
from hps.tiers.watermarks import BUCKETS
from hps.topology import Topology, topology
from hps.types import JSON


@dataclass(frozen=True)
class TablePlan:
    table: str
    dim: int
    row_dtype: str  # the table's row format (hps_row_dtype)
    row_bytes: int  # one stored row: 4 x dim (float32), 2 x dim (float16), dim + 8 (int8)
    rows: int
    rows_from: str  # "sparse_files" | "given" | "unknown"
    cache_rows: int
    cache_bytes: int  # one cache
    cache_memory: str  # "gpu" | "host" | "auto" (gpu where start-up calibration picks CuPy)
    devices: int
    instances_per_device: int
    cache_bytes_per_device: int
    l2_type: str
    l2_rows: int
    l2_bytes_per_row: float  # one row in L2, key and bookkeeping included (0: no L2)
    l2_bytes: int  # all copies (one per instance for the in-process hash_map)
    l2_side_bytes_per_row: float  # one update-version side row in L2 (0: none kept there)
    l2_side_bytes: int  # the update-version side tables in L2, all copies (l2_side_bytes)
    l3_bytes_per_row: float  # one row on disk in L3 (0: no L3)
    l3_bytes: int
    raw_bytes: int  # rows x dim x 4, the naive sizing rule (float32)


def l2_bytes_per_row(cfg: VolatileDBConfig, dim: int, fmt: RowFormat = FLOAT32) -> float:
    """One L2 row's bytes in format ``fmt``, as its backend declares them."""
    if cfg.type == "disabled":
        return 0.0
    return bytes_per_row(cfg.type, dim, fmt, bounded=cfg.bounded)


def l2_segment_bytes(config: PSConfig) -> int:
    """The fixed bytes of the node's ``multi_process_hash_map`` segment, once per node
    whatever its tables: the header, the free-extent stack and the table entries before its
    first extent (``data_off`` of :func:`hps.config.segment.segment_geometry`, the layout
    the segment itself uses; committed when the segment is created). 0 for another L2."""
    vdb = config.volatile_db
    if vdb.type != "multi_process_hash_map":
        return 0
    return segment_geometry(vdb.shared_memory_size, vdb.allocation_rate).data_off


REDIS_TYPES = ("redis", "redis_cluster")


def l2_rows(config: PSConfig, rows: int) -> int:
    """The rows of a table of ``rows`` rows that L2 holds once filled: the loader's share
    (``initial_cache_rate`` beside an L3, every row without one: :mod:`hps.loading.loader`;
    every row with ``cache_missed_embeddings``), at most ``overflow_margin`` rows, which Redis
    counts per partition (``x num_partitions``)."""
    vdb = config.volatile_db
    if vdb.type == "disabled":
        return 0
    margin = vdb.overflow_margin * (vdb.num_partitions if vdb.type in REDIS_TYPES else 1)
    n = min(rows, margin)
    if topology(config).l3 and not vdb.cache_missed_embeddings:
        n = min(n, math.ceil(vdb.initial_cache_rate * rows))
    return n


def side_tables_in_l2(config: PSConfig) -> bool:
    """Whether L2 keeps the update-version side tables beside each table (Kafka updates
    written to L2 with no L3: :mod:`hps.tiers.versions`)."""
    topo = topology(config)
    return topo.l2 is not None and topo.updates != "none" and not topo.l3


def l2_side_bytes(vdb: VolatileDBConfig, rows: int) -> int:
    """The update-version side tables of one table of ``rows`` L2 rows: the version table
    at worst a row of :data:`~hps.tiers.side_tables.LIMBS` float32 (16 bytes) per row, and
    the watermark table's :data:`~hps.tiers.watermarks.BUCKETS` rows and its sync key."""
    return table_bytes(vdb, rows, LIMBS) + table_bytes(vdb, BUCKETS + 1, LIMBS)


def check_l2_segment(config: PSConfig, plans: list[TablePlan]) -> str | None:
    """What the planned L2 (:func:`l2_segment_bytes` and the tables' extents: ``totals``'
    ``l2_bytes``) says against the ``multi_process_hash_map`` segment's
    ``shared_memory_size``: a :class:`ConfigError` where it does not fit and there is no L3
    (a full segment evicts rows, which are then answered with the default vector), a
    warning where there is one (the evicted rows come from L3), None where it fits."""
    vdb = config.volatile_db
    if vdb.type != "multi_process_hash_map":
        return None
    need = totals(plans, l2_segment_bytes(config))["l2_bytes"]
    if need <= vdb.shared_memory_size:
        return None
    said = (
        f"{config.source}: volatile_db.shared_memory_size = {vdb.shared_memory_size:,} bytes "
        f"({human(vdb.shared_memory_size)}) but the planned L2 needs {need:,} "
        f"({human(need)}): a full segment evicts rows"
    )
    if not topology(config).l3:
        raise ConfigError(
            f"{said}, answered with the default vector without L3: raise shared_memory_size"
        )
    return f"warning: {said}, read again from L3 on each miss"


def l1_notes(plans: list[TablePlan]) -> list[str]:
    """A note per table whose L1 capacity is over twice its rows (and above the minimum
    capacity): the rows beyond the table's are paid for and never filled."""
    return [
        f"note: {p.table}: L1 capacity {p.cache_rows:,} rows for a table of {p.rows:,} rows "
        f"({human(p.cache_bytes)} per cache): set gpucacheper (a share of each table's rows) "
        "instead of hps_cache.capacity, or a lower hps_cache.capacity"
        for p in plans
        if p.rows_from != "unknown" and p.cache_rows > max(2 * p.rows, MIN_CAPACITY)
    ]


def l3_bytes_per_row(cfg: PersistentDBConfig, dim: int, fmt: RowFormat = FLOAT32) -> float:
    """One L3 row's bytes on disk in format ``fmt``."""
    if cfg.type == "disabled":
        return 0.0
    return bytes_per_row(cfg.type, dim, fmt)


def _rows(model: ModelConfig, index: int, given: dict[str, int]) -> tuple[int, str]:
    from hps.io.sparse_model import sparse_model_rows

    spec = model.tables[index]
    if spec.name in given:
        return given[spec.name], "given"
    if not model.sparse_files:
        return 0, "unknown"  # filled from .npy files or L3: only --rows can say
    folder = model.sparse_files[index]
    if not Path(folder).is_dir():
        raise ConfigError(
            f"{spec.name}: sparse_files {folder!r} is not a folder; give --rows "
            f"{spec.name}=N to plan without it"
        )
    return sparse_model_rows(folder, spec.dim), "sparse_files"


def _cache_memory(model: ModelConfig) -> str:
    """Where the L1 caches live: decided at start-up for ``auto`` (:mod:`hps.cache.auto`)."""
    return {"cupy": "gpu", "numpy": "host"}.get(model.hps_cache.device, "auto")


@dataclass(frozen=True)
class L1GpuPlan:
    """A model's L1 on a GPU (``hps_cache.device`` ``cupy``, or ``auto``: where start-up
    picks CuPy), per Triton instance: its caches in device memory (every table's
    :func:`hps.cache.cache_nbytes`) and its staging buffers (the host path's, or with
    ``cupy`` those of rows kept on the GPU), sized for a request of the configured size
    (``request_keys``: :func:`hps.cache.calibrate.request_keys`) as they grow
    (:func:`hps.cache.gpu_request.request_staging`): device memory and pinned (page-locked)
    host memory."""

    model: str
    device: str  # hps_cache.device: "cupy" | "auto"
    request_keys: int  # keys of one request, all tables
    cache_bytes: int  # device memory, one instance's caches
    staging_device_bytes: int  # device memory, one embedding instance's staging buffers
    staging_pinned_bytes: int  # pinned host memory, one embedding instance's staging buffers
    ctr_staging_device_bytes: int  # the same for a CTR instance (rows kept on the GPU); 0: none
    ctr_staging_pinned_bytes: int
    instances: int  # processes: hps_instances, twice with a CTR model (ModelConfig.processes)
    devices: int
    instances_per_device: int
    device_bytes_per_device: int  # (caches + staging) of the instances on one device
    pinned_bytes: int  # staging pinned x instances: host memory the node pins


def l1_gpu(config: PSConfig, plans: list[TablePlan]) -> list[L1GpuPlan]:
    """One :class:`L1GpuPlan` per model whose L1 is or may be on a GPU."""
    out = []
    for model in config.models:
        if not model.gpucache or model.hps_cache.device == "numpy":
            continue
        names = {t.name for t in model.tables}
        mine = [p for p in plans if p.table in names]
        keys, dims = request_keys(model), [t.dim for t in model.tables]
        # KIND_GPU instances (cupy) answer on their GPU, auto's KIND_CPU ones on the host
        staging = request_staging(keys, dims, rows_on_device=bool(model.instance_gpus))
        ctr = None
        if model.serves_ctr:  # its rows stay on the GPU and are pooled there
            ctr = request_staging(
                keys, dims, rows_on_device=True, pooled_samples=model.max_batch_size
            )
        caches = sum(p.cache_bytes for p in mine)
        devices = len(model.instance_gpus) or 1
        per_device = math.ceil(model.hps_instances / devices)  # of each Triton model
        ctr_device, ctr_pinned = (ctr.device, ctr.pinned) if ctr else (0, 0)
        out.append(
            L1GpuPlan(
                model=model.model,
                device=model.hps_cache.device,
                request_keys=sum(keys),
                cache_bytes=caches,
                staging_device_bytes=staging.device,
                staging_pinned_bytes=staging.pinned,
                ctr_staging_device_bytes=ctr_device,
                ctr_staging_pinned_bytes=ctr_pinned,
                instances=model.processes,
                devices=devices,
                instances_per_device=per_device * (2 if ctr else 1),
                device_bytes_per_device=per_device
                * (caches + staging.device + (caches + ctr_device if ctr else 0)),
                pinned_bytes=model.hps_instances * (staging.pinned + ctr_pinned),
            )
        )
    return out


def gpu_lines(gpus: list[L1GpuPlan]) -> list[str]:
    """``hps plan``'s lines for :func:`l1_gpu`: device memory and pinned host memory apart."""
    lines = []
    for g in gpus:
        when = "" if g.device == "cupy" else " (hps_cache.device: auto, if start-up picks cupy)"
        ctr = ""
        if g.ctr_staging_device_bytes:
            ctr = (
                f"; a CTR instance (rows kept on the GPU): staging "
                f"{human(g.ctr_staging_device_bytes)} device, "
                f"{human(g.ctr_staging_pinned_bytes)} pinned"
            )
        lines.append(
            f"L1 GPU memory, model {g.model}{when}: per instance: caches "
            f"{human(g.cache_bytes)} + staging {human(g.staging_device_bytes)} device memory, "
            f"staging {human(g.staging_pinned_bytes)} pinned host memory (requests of "
            f"{g.request_keys:,} keys){ctr}; per device ({g.instances_per_device} instances): "
            f"{human(g.device_bytes_per_device)} device memory; per node ({g.instances} "
            f"instances): {human(g.pinned_bytes)} pinned host memory"
        )
    return lines


def plan(config: PSConfig, rows: dict[str, int] | None = None) -> list[TablePlan]:
    """One :class:`TablePlan` per table of every model."""
    given = dict(rows or {})
    unknown = set(given) - {t.name for t in config.tables}
    if unknown:
        raise ConfigError(f"--rows names unknown tables {sorted(unknown)}")
    vdb, out = config.volatile_db, []
    topo, side = topology(config), side_tables_in_l2(config)
    for model in config.models:
        devices = len(model.instance_gpus) or 1  # Triton fills each GPU round robin
        per_device = math.ceil(model.hps_instances / devices) * (2 if model.serves_ctr else 1)
        memory = _cache_memory(model) if model.gpucache else "host"
        for i, spec in enumerate(model.tables):
            n, source = _rows(model, i, given)
            fmt = spec.fmt
            cap = cache_capacity(model, n)
            one = cache_nbytes(cap, spec.dim, model.hps_cache.policy, fmt) if cap else 0
            in_l2 = l2_rows(config, n)
            copies = model.processes if topo.l2 == "process" else 1
            l2_row = l2_bytes_per_row(vdb, spec.dim, fmt)
            side_row = l2_bytes_per_row(vdb, LIMBS) if side else 0.0
            l3_row = l3_bytes_per_row(config.persistent_db, spec.dim, fmt) if topo.l3 else 0.0
            out.append(
                TablePlan(
                    table=spec.name,
                    dim=spec.dim,
                    row_dtype=fmt.name,
                    row_bytes=fmt.row_bytes(spec.dim),
                    rows=n,
                    rows_from=source,
                    cache_rows=cap,
                    cache_bytes=one,
                    cache_memory=memory,
                    devices=devices,
                    instances_per_device=per_device,
                    cache_bytes_per_device=one * per_device,
                    l2_type=vdb.type,
                    l2_rows=in_l2,
                    l2_bytes_per_row=round(l2_row, 1),
                    l2_bytes=table_bytes(vdb, in_l2, spec.dim, fmt) * copies if l2_row else 0,
                    l2_side_bytes_per_row=round(side_row, 1),
                    l2_side_bytes=l2_side_bytes(vdb, in_l2) * copies if side_row else 0,
                    l3_bytes_per_row=round(l3_row, 1),
                    l3_bytes=int(n * l3_row),
                    raw_bytes=n * spec.dim * 4,
                )
            )
    return out


def totals(plans: list[TablePlan], l2_segment: int = 0) -> dict[str, int]:
    """Sums over tables (cache per device: every table's caches on one device), L2 with
    ``l2_segment`` (:func:`l2_segment_bytes`) once and the side tables (``l2_side_bytes``,
    also given apart)."""
    return {
        "cache_bytes_per_device": sum(p.cache_bytes_per_device for p in plans),
        "l2_bytes": l2_segment + sum(p.l2_bytes + p.l2_side_bytes for p in plans),
        "l2_side_bytes": sum(p.l2_side_bytes for p in plans),
        "l3_bytes": sum(p.l3_bytes for p in plans),
        "raw_bytes": sum(p.raw_bytes for p in plans),
    }


def totals_by_format(plans: list[TablePlan]) -> dict[str, dict[str, int]]:
    """:func:`totals` of the tables of each row format present (in ROW_DTYPES order)."""
    return {
        name: totals([p for p in plans if p.row_dtype == name])
        for name in ROW_DTYPES
        if any(p.row_dtype == name for p in plans)
    }


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _total_line(label: str, t: dict[str, int]) -> tuple[str, ...]:
    return (
        label,
        "",
        "",
        "",
        "",
        "",
        human(t["cache_bytes_per_device"]),
        "",
        "",
        human(t["l2_bytes"]),
        human(t["l2_side_bytes"]),
        "",
        human(t["l3_bytes"]),
        human(t["raw_bytes"]),
    )


def format_text(plans: list[TablePlan], l2_segment: int = 0) -> str:
    """The table of ``hps plan``; ``l2_segment``: the shared L2 segment's fixed bytes
    (:func:`l2_segment_bytes`), a row of its own, in the total. The column ``L2 side`` (the
    update-version side tables, in the L2 total) only where L2 keeps them."""
    header = (
        "table",
        "dim",
        "format",
        "row B",
        "rows",
        "L1 rows",
        "L1/device",
        "L1 on",
        "L2 B/row",
        "L2",
        "L2 side",
        "L3 B/row",
        "L3",
        "raw",
    )
    lines: list[tuple[str, ...]] = [header]
    for p in plans:
        rows = f"{p.rows:,}" + ("" if p.rows_from != "unknown" else " (unknown)")
        l1 = f"{human(p.cache_bytes_per_device)}"
        if p.instances_per_device > 1:
            l1 += f" ({p.instances_per_device}x{human(p.cache_bytes)})"
        lines.append(
            (
                p.table,
                str(p.dim),
                p.row_dtype,
                str(p.row_bytes),
                rows,
                f"{p.cache_rows:,}",
                l1,
                f"{p.cache_memory} x{p.devices}",
                f"{p.l2_bytes_per_row:.0f}",
                f"{human(p.l2_bytes)} ({p.l2_type})",
                f"{human(p.l2_side_bytes)} ({p.l2_side_bytes_per_row:.0f} B/row)",
                f"{p.l3_bytes_per_row:.0f}",
                human(p.l3_bytes),
                human(p.raw_bytes),
            )
        )
    by_format = totals_by_format(plans)
    if len(by_format) > 1:
        lines += [_total_line(f"total {name}", t) for name, t in by_format.items()]
    if l2_segment:
        segment = [""] * len(header)
        segment[0] = "L2 segment"
        segment[9] = f"{human(l2_segment)} (header, {MAX_TABLES} entries)"
        lines.append(tuple(segment))
    lines.append(_total_line("total", totals(plans, l2_segment)))
    if not any(p.l2_side_bytes for p in plans):
        lines = [row[:10] + row[11:] for row in lines]
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    text = "\n".join("  ".join(_cells(row, widths)) for row in lines)
    if unknown := [p.table for p in plans if p.rows_from == "unknown"]:
        text += (
            f"\n(unknown): {len(unknown)} table(s) without sparse_files, counted as 0 rows "
            "(L1 at its minimum): give --rows model.table=N for each"
        )
    return text


def _cells(row: tuple[str, ...], widths: list[int]) -> list[str]:
    """The first column left-aligned, the numbers right-aligned."""
    return [
        c.ljust(w) if i == 0 else c.rjust(w)
        for i, (c, w) in enumerate(zip(row, widths, strict=True))
    ]


def version_costs(config: PSConfig, plans: list[TablePlan]) -> list[str]:
    """What each model version costs beside the first (:mod:`hps.versions`): its rows are a
    whole copy in their own namespace in every tier that holds them. L1 and a serving-filled
    L2 (hash_map, multi_process_hash_map) are paid per *served* version (each has its own
    instances); a Redis L2 (filled at import) and L3 per *kept* version."""
    lines = []
    for m in config.models:
        mine = totals([p for p in plans if p.table.startswith(f"{m.model}.")])
        keep = m.hps_keep_versions
        filled_by_serving = topology(config).l2_filled_by == "serving"
        l2_per = "served" if filled_by_serving else "kept"
        lines.append(
            f"model {m.model}: each further version +{human(mine['cache_bytes_per_device'])} "
            f"L1 per device (per served version), +{human(mine['l2_bytes'])} L2 (per {l2_per} "
            f"version), +{human(mine['l3_bytes'])} L3 (per kept version); hps_keep_versions "
            f"= {keep}: up to {keep} kept and served after an activation (versions imported "
            "above the live one kept besides, not served)"
        )
    return lines


def l3_memory(config: PSConfig) -> str | None:
    """What RocksDB holds in memory in each process that opens L3, beyond the table above."""
    db = config.persistent_db
    if db.type == "disabled":
        return None
    w, c = db.hps_write_buffer_mb, db.hps_block_cache_mb
    return (
        f"L3 memory per process that opens it: memtables up to {w} MiB + block cache {c} MiB "
        f"(persistent_db.hps_write_buffer_mb, hps_block_cache_mb); a secondary replays the "
        f"writer's WAL into memtables of its own, up to {2 * w} MiB"
    )


def to_json(
    plans: list[TablePlan],
    topo: Topology,
    versions: list[str] | None = None,
    gpus: list[L1GpuPlan] | None = None,
    l2_segment: int = 0,
    notes: list[str] | None = None,
    warnings: list[str] | None = None,
) -> str:
    doc: JSON = {
        "warnings": warnings or [],  # check_l2_segment
        "notes": notes or [],  # l1_notes
        "versions": versions or [],
        "topology": topo.as_dict(),
        "tables": [asdict(p) for p in plans],
        "l1_gpu": [asdict(g) for g in gpus or []],
        "l2_segment_bytes": l2_segment,  # once per node, in totals' l2_bytes
        "totals": totals(plans, l2_segment),
        "totals_by_format": totals_by_format(plans),
    }
    return json.dumps(doc, indent=2)

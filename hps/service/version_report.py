"""What each version of a model holds per tier: ``GET /v1/models/{model}/versions`` and
``hps versions list`` (the same report).

A reader declares the tables it reports on (:func:`declare`): in L3 every ready or live
version's, in L2 only the versions Triton serves (the versions whose serving processes
fill L2; declaring a table of the node's shared L2 takes one of its table entries). A tier
that does not declare a version's tables (L2 of a version not served, any tier of a version
still loading or retired, an L2 that belongs to each serving process) reports ``None``.

Bytes are rows times the tier's cost of a row of that table (key and bookkeeping included:
the figure ``hps plan`` uses), summed over the version's tables.

Needs nothing beyond the core: the CLI imports it without the ``admin`` extra.
"""

from __future__ import annotations

from hps.config import PSConfig
from hps.errors import UnknownTableError
from hps.tiers import RowStore, Tiers
from hps.tiers.rows import bytes_per_row
from hps.types import JSON, TableSpec
from hps.versions import VersionInfo, VersionRegistry

TIERS = ("l2", "l3")


def declared(config: PSConfig) -> tuple[list[TableSpec], list[TableSpec]]:
    """The tables a reader declares: (in L3: every ready or live version's, in L2: those
    of the versions Triton serves), over every model of ``config``."""
    registry = VersionRegistry(config)
    l3: list[TableSpec] = []
    l2: list[TableSpec] = []
    for model in config.models:
        infos = registry.versions(model.model)
        live = next(v.version for v in infos if v.state == "live")
        served = set(registry.served(model.model, live))
        for info in infos:
            if info.state in ("ready", "live"):
                tables = info.model_config().tables
                l3 += tables
                l2 += tables if info.version in served else []
    return l3, l2


def declare(tiers: Tiers, l3: list[TableSpec], l2: list[TableSpec]) -> None:
    """Declare ``l3``'s tables in L3 and ``l2``'s in L2 (:func:`declared`)."""
    if tiers.persistent is not None:
        tiers.subset(l2=False).open_tables(l3)
    if tiers.volatile is not None:
        tiers.subset(l3=False).open_tables(l2)


def table_rows(store: RowStore | None, spec: TableSpec, exact: bool) -> int | None:
    """Rows of ``spec`` in ``store`` (exactly, or the store's estimate); None where the
    tier is absent or does not declare the table."""
    if store is None:
        return None
    try:
        return int(store.size(spec.name) if exact else store.estimated_size(spec.name))
    except UnknownTableError:  # not declared in this tier (see the module docstring)
        return None


def _tier_totals(
    config: PSConfig, tiers: Tiers | None, specs: list[TableSpec], exact: bool
) -> tuple[dict[str, int | None], dict[str, int | None]]:
    """(rows per tier, bytes per tier) of these tables; None where a tier cannot tell."""
    rows: dict[str, int | None] = {}
    nbytes: dict[str, int | None] = {}
    for tier in TIERS:
        store = None if tiers is None else (tiers.volatile if tier == "l2" else tiers.persistent)
        kind = config.volatile_db.type if tier == "l2" else config.persistent_db.type
        counts = [table_rows(store, spec, exact) for spec in specs] if specs else [None]
        if any(n is None for n in counts):
            rows[tier] = nbytes[tier] = None
            continue
        pairs = list(zip(counts, specs, strict=True))
        rows[tier] = sum(n or 0 for n, _ in pairs)
        nbytes[tier] = int(sum((n or 0) * bytes_per_row(kind, s.dim, s.fmt) for n, s in pairs))
    return rows, nbytes


def estimated(tiers: Tiers | None, exact: bool) -> list[str]:
    """The tiers whose row counts are the store's estimate (RocksDB without ``exact``)."""
    if tiers is None or exact:
        return []
    pairs = (("l2", tiers.volatile), ("l3", tiers.persistent))
    return [t for t, s in pairs if s is not None and not s.exact_size]


def version_view(
    config: PSConfig, info: VersionInfo, tiers: Tiers | None, served: list[int], exact: bool
) -> JSON:
    """One version: number, state, created, served, its tables' rows and bytes per tier."""
    tables = info.model_config().tables
    specs = tables if info.state in ("ready", "live") else []
    rows, nbytes = _tier_totals(config, tiers, specs, exact)
    return {
        "version": info.version,
        "state": info.state,
        "rows_left": info.rows_left,  # retired, its rows not dropped yet
        "shared_rows_left": info.shared_rows_left,  # retired, kept in a shared L2 for others
        "created": info.created or None,  # None: version 1 of a model never versioned
        "served": info.version in served,
        "tables": len(tables),
        "dims": [t.dim for t in tables],  # per table, in the entry's order
        "row_dtypes": [t.row_dtype for t in tables],
        "rows": rows,
        "bytes": nbytes,
    }


def versions_report(config: PSConfig, model: str, tiers: Tiers | None, exact: bool) -> JSON:
    """Every version of ``model`` (retired ones too, oldest first), with the live one, the
    served ones and the rollback setting; ``tiers`` must have :func:`declare`'d."""
    registry = VersionRegistry(config)
    infos = registry.versions(model)  # an unknown model: UnknownTableError
    live = next(v.version for v in infos if v.state == "live")
    served = registry.served(model, live)
    return {
        "model": model,
        "live": live,
        "served": served,
        "keep_versions": config.model(model).hps_keep_versions,
        "rows_estimated": estimated(tiers, exact),
        "versions": [version_view(config, info, tiers, served, exact) for info in infos],
    }

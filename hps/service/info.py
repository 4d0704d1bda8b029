"""What ``GET /v1/models`` and ``GET /v1/models/{model}/tables/{table}`` report.

Row counts are the stores' own by default: RocksDB's is an estimate (``estimate-num-keys``,
from metadata), named in ``rows_estimated``. An exact count, asked for with ``exact``
(here and by ``GET /v1/models/{model}/versions``), scans L3's keys (about 0.7 s per
million rows) on one of the few threads every sync route shares: at most
:data:`MAX_EXACT_COUNTS` run at once in the process (:func:`counting_exactly`), past that
a request is refused (429) rather than queued.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from hps.config import ModelConfig
from hps.errors import HPSError, QueueFullError
from hps.service.state import AdminState, topology_view
from hps.service.version_report import estimated, table_rows
from hps.tiers import Tiers
from hps.types import JSON, TableSpec
from hps.updates.metrics import Buckets, merged, summary

log = logging.getLogger(__name__)

KAFKA_TIMEOUT_S = 3.0
MAX_EXACT_COUNTS = 2  # exact row counts (L3 key scans) running at once in this process
EXACT_RETRY_S = 5
_exact_counts = threading.BoundedSemaphore(MAX_EXACT_COUNTS)


@contextmanager
def counting_exactly(reader: Tiers, exact: bool) -> Iterator[None]:
    """Held while a report counts rows exactly where a tier of ``reader`` counts by scanning
    (RocksDB; the other stores count cheaply and always exactly, and take no place): at
    most :data:`MAX_EXACT_COUNTS` at once, else QueueFullError (429, Retry-After)."""
    if not exact or not estimated(reader, exact=False):
        yield
        return
    if not _exact_counts.acquire(blocking=False):
        raise QueueFullError(
            f"{MAX_EXACT_COUNTS} exact row counts are running (exact=true: each scans L3's "
            f"keys): retry in {EXACT_RETRY_S} s, or leave exact out for RocksDB's estimate",
            retry_after_s=EXACT_RETRY_S,
        )
    try:
        yield
    finally:
        _exact_counts.release()


@dataclass(frozen=True)
class Lags:
    """Per topic and partition: messages ``hps consume`` has not committed, or why unknown."""

    by_topic: dict[str, dict[int, int]]
    error: str | None = None

    def of(self, spec: TableSpec) -> dict[str, int] | dict[str, str]:
        from hps.updates.codec import topic_name

        if self.error is not None:
            return {"error": self.error}
        return {
            str(p): n for p, n in self.by_topic.get(topic_name(spec.model, spec.table), {}).items()
        }


def consumer_lags(state: AdminState, specs: list[TableSpec]) -> Lags:
    """The lags of these tables' topics, in one round of requests to the broker; reports
    asking for the same tables within :data:`~hps.service.state.REPORT_MAX_AGE_S` share it
    (the last question asked is kept: a model's listing, or one table's report)."""
    if not state.kafka:
        return Lags({})
    from hps.updates.codec import topic_name

    topics = frozenset(topic_name(s.model, s.table) for s in specs)
    return state.lag_reads.get(topics, partial(_read_lags, state))


def _read_lags(state: AdminState, topics: frozenset[str]) -> Lags:
    try:
        group = state.config.update_source.hps_group_id
        lags = state.broker().group_lag(group, sorted(topics), timeout_s=KAFKA_TIMEOUT_S)
    except HPSError as exc:  # an answerless broker must not fail the whole report
        return Lags({}, str(exc))
    return Lags(lags)


Hits = dict[tuple[str, str], dict[str, float]]
Freshness = dict[tuple[str, str], Buckets]


MetricsRead = tuple[Hits, Freshness, str | None]


def triton_metrics(state: AdminState) -> MetricsRead:
    """Hits per level and update freshness from one read of Triton's /metrics (summed over
    processes), or the reason for neither; shared by the reports of the next
    :data:`~hps.service.state.REPORT_MAX_AGE_S`."""
    return state.metrics_reads.get(None, partial(_read_metrics, state))


def _read_metrics(state: AdminState, _: None) -> MetricsRead:
    try:
        hits, fresh = state.triton.hits_and_freshness()
    except Exception as exc:
        return {}, {}, str(exc)
    return hits, fresh, None


def freshness_of(spec: TableSpec, fresh: Freshness, error: str | None) -> JSON:
    """A table's update freshness in its serving processes (the model and its ``_ctr``
    model), since they started: count of update messages, p50 and p99 in seconds (None
    before the first); ``error`` when Triton's metrics could not be read."""
    served = {(spec.model, spec.table), (spec.model + "_ctr", spec.table)}
    buckets = merged(b for key, b in fresh.items() if key in served)
    out: JSON = {**summary(buckets), "since": "serving processes started"}
    if error is not None:
        out["error"] = error
    return out


def table_info(
    state: AdminState,
    spec: TableSpec,
    hits: Hits,
    reader: Tiers,
    lags: Lags,
    *,
    exact: bool,
    fresh: tuple[Freshness, str | None] = ({}, None),
) -> JSON:
    """One table's report; ``reader`` (caught up) and ``lags`` are fetched once per request.

    ``exact``: count the rows of every tier exactly; else a store whose exact count is a
    scan (RocksDB: about 0.7 s per million rows) reports its estimate, and
    ``rows_estimated`` names those tiers. A listing of all tables never counts exactly."""
    from hps.cache import cache_capacity

    model = state.config.model(spec.model)
    l3_rows = table_rows(reader.persistent, spec, exact)
    counts: dict[str, float] = {}
    for served in (spec.model, spec.model + "_ctr"):
        for level, n in hits.get((served, spec.table), {}).items():
            counts[level] = counts.get(level, 0.0) + n
    total = sum(counts.values())
    return {
        "model": spec.model,
        "table": spec.table,
        "version": spec.version,  # the model version whose rows these are (the live one)
        "dim": spec.dim,
        "row_dtype": spec.row_dtype,
        "row_bytes": spec.fmt.row_bytes(spec.dim),
        "default_value": float(spec.default_value),
        "rows": {"l2": table_rows(reader.volatile, spec, exact), "l3": l3_rows},
        "rows_estimated": estimated(reader, exact),
        "l1": {
            "enabled": model.gpucache,
            "capacity_per_instance": cache_capacity(model, l3_rows or 0),
            "policy": model.hps_cache.policy,
            "instances": model.hps_instances,
        },
        "hits": counts,
        "hit_rates": {k: v / total for k, v in counts.items()} if total else {},
        "consumer_lag": lags.of(spec) if state.kafka else None,
        "freshness": freshness_of(spec, *fresh) if state.kafka else None,
        "last_update_version": reader.last_version(spec),
    }


def one_table(state: AdminState, spec: TableSpec, exact: bool = False) -> JSON:
    """One table's report; ``exact``: count the rows of every tier exactly (bounded:
    :func:`counting_exactly`), else L3's is RocksDB's estimate."""
    hits, fresh, why = triton_metrics(state)
    lags = consumer_lags(state, [spec])
    with state.reading() as reader, counting_exactly(reader, exact):
        return table_info(state, spec, hits, reader, lags, exact=exact, fresh=(fresh, why))


def _models(state: AdminState, live: list[ModelConfig]) -> tuple[list[JSON], str | None]:
    """These models (at their live version) with their tables; why Triton's metrics are
    missing, if they are."""
    hits, fresh_hist, why = triton_metrics(state)
    fresh = (fresh_hist, why)
    lags = consumer_lags(state, [t for m in live for t in m.tables])
    with state.reading() as reader:
        models: list[JSON] = [
            {
                "model": m.model,
                "version": m.version,  # the live one
                "instances": m.hps_instances,
                "tables": [
                    table_info(state, spec, hits, reader, lags, exact=False, fresh=fresh)
                    for spec in m.tables
                ],
            }
            for m in live
        ]
    return models, why


def models_info(state: AdminState) -> JSON:
    models, why = _models(state, state.live_config().models)
    topo = topology_view(state.config, state.topology)
    return {"models": models, "topology": topo, "metrics_error": why}


def model_info(state: AdminState, model: str) -> JSON:
    """One served model as ``GET /v1/models`` lists it (a model not served: 404)."""
    state.config.model(model)
    (one,), why = _models(state, [state.live_model(model)])
    return {**one, "metrics_error": why}

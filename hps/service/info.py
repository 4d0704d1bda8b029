"""What ``GET /v1/models`` and ``GET /v1/models/{model}/tables/{table}`` report."""

from __future__ import annotations

import logging
from typing import Any

from hps.service.state import AdminState, topology_view
from hps.types import TableSpec

log = logging.getLogger(__name__)

KAFKA_TIMEOUT_S = 3.0


def _rows(store: Any, spec: TableSpec) -> int | None:
    return None if store is None else int(store.size(spec.name))


def last_version(store: Any, spec: TableSpec) -> int | None:
    """The highest update version applied to the table (its partitions' watermarks)."""
    from hps.updates.versions import Watermarks, from_limbs

    if store is None:
        return None
    marks = Watermarks(store, spec)
    top = [int(from_limbs(limbs).max()) for _, limbs in store.dump(marks.spec.name) if limbs.size]
    return max(top) if top else None


def consumer_lag(state: AdminState, spec: TableSpec) -> dict[str, int] | None:
    """Per partition of the table's topic: messages the ``hps consume`` group has not committed."""
    if not state.kafka:
        return None
    from confluent_kafka import Consumer, TopicPartition

    from hps.updates.codec import topic_name

    src = state.config.update_source
    topic = topic_name(spec.model, spec.table)
    conf = {
        "bootstrap.servers": src.brokers,
        "group.id": src.hps_group_id,
        "enable.auto.commit": False,
        **dict(src.hps_kafka_config),
    }
    consumer = Consumer(conf)
    try:
        meta = consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        committed = consumer.committed(parts, timeout=KAFKA_TIMEOUT_S)
        lag = {}
        for tp in committed:
            low, high = consumer.get_watermark_offsets(tp, timeout=KAFKA_TIMEOUT_S)
            done = tp.offset if tp.offset >= 0 else low
            lag[str(tp.partition)] = max(0, int(high) - int(done))
        return lag
    finally:
        consumer.close()


def _safe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # an answerless broker must not fail the whole report
        return {"error": str(exc)}


def hit_rates(state: AdminState) -> tuple[dict[tuple[str, str], dict[str, float]], str | None]:
    """Hits per level from Triton's /metrics (summed over processes), or the reason for none."""
    try:
        return state.triton.hit_counts(), None
    except Exception as exc:
        return {}, str(exc)


def table_info(
    state: AdminState, spec: TableSpec, hits: dict[tuple[str, str], dict[str, float]]
) -> dict[str, Any]:
    from hps.cache import cache_capacity

    reader = state.reader()
    model = state.config.model(spec.model)
    l3_rows = _rows(reader.persistent, spec)
    counts: dict[str, float] = {}
    for served in (spec.model, spec.model + "_ctr"):
        for level, n in hits.get((served, spec.table), {}).items():
            counts[level] = counts.get(level, 0.0) + n
    total = sum(counts.values())
    stores = reader.stores
    return {
        "model": spec.model,
        "table": spec.table,
        "dim": spec.dim,
        "default_value": float(spec.default_value),
        "rows": {"l2": _rows(reader.volatile, spec), "l3": l3_rows},
        "l1": {
            "enabled": model.gpucache,
            "capacity_per_instance": cache_capacity(model, l3_rows or 0),
            "policy": model.hps_cache.policy,
            "instances": model.hps_instances,
        },
        "hits": counts,
        "hit_rates": {k: v / total for k, v in counts.items()} if total else {},
        "consumer_lag": _safe(consumer_lag, state, spec),
        "last_update_version": last_version(stores[0], spec) if stores else None,
    }


def models_info(state: AdminState) -> dict[str, Any]:
    hits, why = hit_rates(state)
    models = [
        {
            "model": m.model,
            "instances": m.hps_instances,
            "tables": [table_info(state, spec, hits) for spec in m.tables],
        }
        for m in state.config.models
    ]
    topo = topology_view(state.config, state.topology)
    return {"models": models, "topology": topo, "metrics_error": why}

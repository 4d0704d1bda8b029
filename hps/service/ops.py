"""The work behind the mutating and debugging routes, a few calls into the core each.

Write channel: with Kafka configured, imports and deletes are published (the
:class:`hps.updates.Publisher`) and ``hps consume`` plus the serving processes apply them;
otherwise they are written to L3 and the shared L2 here, and the model is reloaded through
Triton so that every instance reopens L3 and starts a fresh L1.
"""

from __future__ import annotations

import json

import numpy as np

from hps.errors import RequestError
from hps.loading.loader import Loader, TableSource, l2_action
from hps.service.job_records import Job
from hps.service.state import AdminState
from hps.types import JSON, Keys, TableSpec

WARMUP_PARAMETER = "hps_warmup_keysets"


def lookup(state: AdminState, spec: TableSpec, keys: Keys) -> list[JSON]:
    """Where each key is found (l2, l3, default), its float32 vector (decoded from the
    table's row format) and update version; no writes."""
    with state.reading() as tiers:
        got = tiers.fetch(spec, keys)
        versions = tiers.stored_versions(spec, keys)  # beside the data: L3, else L2
    values = spec.fmt.decode(got.values, spec.dim)
    values[~got.found] = spec.default_value
    where = np.array(["default", "", "l2", "l3"], dtype=object)[got.level]
    return [
        {"key": k, "found_in": w, "version": v or None, "vector": vec}
        for k, w, v, vec in zip(
            keys.tolist(), where.tolist(), versions.tolist(), values.tolist(), strict=True
        )
    ]


def delete(state: AdminState, spec: TableSpec, keys: Keys) -> JSON:
    """Remove ``keys`` from L3, L2 and every serving process's L1."""
    if state.kafka:
        pub = state.publisher()
        version = pub.delete(spec.model, spec.table, keys)
        pub.flush()
        return {"deleted": int(keys.size), "via": "kafka", "version": version}
    with state.writer() as tiers:
        tiers.remove(spec.name, keys, durable=True)
    state.reset_reader()
    reloaded = state.reload(spec.model)
    return {"deleted": int(keys.size), "via": "reload", "reloaded": reloaded}


def import_table(state: AdminState, job: Job, source: TableSource) -> JSON:
    """Load a validated source through the one loader (or publish it when Kafka is on)."""
    spec = source.spec
    if state.kafka:
        pub = state.publisher()
        version = None
        for keys, vectors in source.chunks():
            version = pub.publish(spec.model, spec.table, keys, vectors, version)
            job.advance(keys.size)
        pub.flush()
        return {"via": "kafka", "version": version}
    rate = state.config.volatile_db.initial_cache_rate
    with state.writer() as tiers:
        # the node's shared L2 loses the table's keys (its processes refill it); Redis is filled
        action = l2_action(state.topology, own=False)
        Loader(tiers, action, rate, on_rows=job.advance).load(source)
    state.reset_reader()
    return {"via": "reload", "reloaded": state.reload(spec.model)}


def warmup_keys(state: AdminState, model: str, keysets: dict[str, Keys]) -> JSON:
    """Reload ``model`` with these keys per table to load into every instance's L1 at start.

    The keys go to keyset files in the state folder, named by the ``hps_warmup_keysets``
    parameter of a config given with the load request; each new instance warms up from them
    after its usual warm-up (see hps.triton.model.process).
    """
    from hps.io.keyset import write_keyset

    if not state.config.model(model).gpucache:
        raise RequestError(f"model {model!r} has no L1 (gpucache: false): nothing to warm up")
    if not any(k.size for k in keysets.values()):
        raise RequestError(f"warm-up of model {model!r} found no keys: nothing was reloaded")
    folder = state.state_dir / "warmup" / model
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for table, keys in keysets.items():
        path = folder / f"{table}.keyset"
        write_keyset(path, keys)
        files[table] = str(path)
    names = state.reload(model, {WARMUP_PARAMETER: json.dumps(files)})
    return {
        "keys": {t: int(k.size) for t, k in keysets.items()},
        "instances": state.config.model(model).hps_instances,
        "via": "reload",
        "reloaded": names,
    }

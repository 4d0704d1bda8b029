"""``/readyz``: every check that must pass for this node to serve, each with its reason.

1. Triton answers ready; 2. every served model is ready; 3. one real inference per HPS
model returns, for a key sampled from L3 (else L2), the vector L2/L3 hold: a dead Python
stub fails here while Triton's own readiness still says 200; 4. each configured tier
answers (L2: a fetch on the shared store; L3: a catch-up read; Kafka: cluster metadata);
5. where serving processes fill L2 from L3 at start-up, how each table's last fill ended
(:class:`hps.loading.imports.FillRecord`); 6. where the node keeps a change journal
(:mod:`hps.updates.journal`), that no live serving instance reports a problem in its
journal heartbeat: an instance whose ``multi_process_hash_map`` segment was removed or
replaced says so from its move until the new segment is refilled from L3
(:meth:`hps.tiers.shared_l2.SharedL2Watch.problem`), and ``/readyz`` answers 503 with its
reason meanwhile.

A fill that stopped part-way (a damaged L3 block, an L2 that refused rows) does not make
the node unready: L3 answers what L2 lacks, so every answer stays right, only slower. Its
check reads ``{"name": "l2_fill", "ok": true, "state": "degraded", "detail": <reasons>}``
and ``/readyz`` still answers 200 (Kubernetes keeps the pod in service); monitor
``state``. The record of a table is replaced by its next fill and dropped by its next
import.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Protocol

import numpy as np

from hps.errors import HPSError
from hps.loading.imports import FillRecord
from hps.service.state import AdminState
from hps.tiers import Tiers
from hps.triton.repository import served_models
from hps.types import JSON, TableSpec
from hps.updates.journal import LIVE_S, Journal, journal_dir

KAFKA_TIMEOUT_S = 3.0


def _run(name: str, check: Callable[[], str]) -> JSON:
    start = time.perf_counter()
    try:
        detail, ok = check(), True
    except Exception as exc:  # every failure is a reason to report, never a 500
        detail, ok = f"{type(exc).__name__}: {exc}", False
    ms = round(1e3 * (time.perf_counter() - start), 1)
    return {"name": name, "ok": ok, "detail": detail, "ms": ms}


class Reader(Protocol):
    """:meth:`AdminState.reading`'s reader, held until the checks end."""

    def __call__(self, *, catch_up: bool = False) -> Tiers: ...


def _sample(reader: Reader, specs: list[TableSpec]) -> tuple[int, int, np.ndarray] | None:
    """(table index, key, vector) of a key some lower tier holds, or None when all are empty."""
    for store in reader().stores:
        for i, spec in enumerate(specs):
            for keys, vectors in store.dump(spec.name, chunk_rows=1):
                return i, int(keys[0]), np.asarray(vectors[0])
    return None


def _inference(state: AdminState, reader: Reader, model: str, specs: list[TableSpec]) -> str:
    """Through Triton (the live version: an unversioned request) against the live version's
    stored rows."""
    sample = _sample(reader, specs)
    if sample is None:
        numkeys = np.zeros(len(specs), dtype=np.int32)
        numkeys[0] = 1
        out = state.triton.lookup(model, np.array([0], np.int64), numkeys)
        return f"answered ({out.size} values); no stored key to compare"
    index, key, _ = sample
    spec = specs[index]
    numkeys = np.zeros(len(specs), dtype=np.int32)
    numkeys[index] = 1
    # Against what serving answers for it: L2 first, then L3 (the two may differ after an
    # update). The reader's L3 may be up to SECONDARY_LAG_S behind an update Triton already
    # serves: a mismatch looks again, caught up, before it counts.
    for tiers in (reader, partial(reader, catch_up=True)):
        stored = tiers().fetch(spec, np.array([key], np.int64)).values
        expected = spec.fmt.decode(stored, spec.dim)[0]  # serving answers float32
        got = state.triton.lookup(model, np.array([key], np.int64), numkeys).reshape(-1)
        if got.shape == expected.shape and np.allclose(got, expected, rtol=1e-6, atol=1e-6):
            return f"{spec.name} key {key} matches the stored vector"
    raise AssertionError(f"{spec.name} key {key}: Triton returned another vector")


def _l2(state: AdminState, reader: Reader, spec: TableSpec) -> str:
    volatile = reader().volatile
    if volatile is None:
        return f"{state.config.volatile_db.type}: held by each serving process"
    volatile.fetch(spec.name, np.array([0], np.int64))
    return f"{state.config.volatile_db.type} answers"


def _l3(state: AdminState, reader: Reader, spec: TableSpec) -> str:
    persistent = reader().persistent
    if persistent is None:
        return "disabled"
    persistent.fetch(spec.name, np.array([0], np.int64))
    return f"rocks_db at {state.config.persistent_db.path} readable"


def _kafka(state: AdminState) -> str:
    brokers, topics = state.broker().describe(KAFKA_TIMEOUT_S)
    return f"{brokers} broker(s), {topics} topic(s)"


def readiness(state: AdminState) -> tuple[bool, list[JSON]]:
    """All checks, in order; ready when every one passed. L3 is caught up once for all."""
    with contextlib.ExitStack() as held:  # the readers the checks use, until they end

        @cache  # an exception is not cached: each check reports it
        def reader(*, catch_up: bool = False) -> Tiers:
            return held.enter_context(state.reading(catch_up=catch_up))

        return _checks(state, reader)


def _checks(state: AdminState, reader: Reader) -> tuple[bool, list[JSON]]:
    checks = [_run("triton", lambda: _ready(state.triton.server_ready()))]
    try:
        live = state.live_config()  # each model at its live version
    except HPSError as exc:
        live = state.config
        checks.append({"name": "versions", "ok": False, "detail": str(exc), "ms": 0.0})
    for served in served_models(state.config):
        name = served.triton_name
        checks.append(_run(f"model:{name}", partial(_model_ready, state, name)))
    for model in live.models:
        check = partial(_inference, state, reader, model.model, model.tables)
        checks.append(_run(f"inference:{model.model}", check))
    if state.config.volatile_db.type != "disabled":
        checks.append(_run("l2", lambda: _l2(state, reader, live.tables[0])))
    if state.config.persistent_db.type != "disabled":
        checks.append(_run("l3", lambda: _l3(state, reader, live.tables[0])))
    if state.kafka:
        checks.append(_run("kafka", lambda: _kafka(state)))
    topo = state.topology
    if topo.l3 and topo.l2_filled_by == "serving" and topo.state_dir is not None:
        checks.append(_l2_fill(topo.state_dir, {t.name for t in live.tables}))
    if topo.state_dir is not None:
        checks.append(_run("instances", partial(_instances, state, topo.state_dir)))
    return all(c["ok"] for c in checks), checks


def _l2_fill(state_dir: Path, names: set[str]) -> JSON:
    """Degraded (still ok) when a live table's last start-up fill of L2 from L3 stopped."""
    start = time.perf_counter()
    record = FillRecord(state_dir).read()
    failed = sorted(
        (t, str(e["problem"])) for t, e in record.items() if t in names and e.get("problem")
    )
    detail = "; ".join(why for _, why in failed) or (
        f"{sum(1 for t in record if t in names)} table(s) filled from L3"
    )
    return {
        "name": "l2_fill",
        "ok": True,
        "state": "degraded" if failed else "ok",
        "detail": detail,
        "tables": [t for t, _ in failed],
        "ms": round(1e3 * (time.perf_counter() - start), 1),
    }


def _instances(state: AdminState, state_dir: Path) -> str:
    """No live serving instance of this config's models reports a problem in its change
    journal heartbeat (e.g. its shared L2 being refilled); each one's reason otherwise."""
    models = {m.model for m in state.config.models}
    cursors = Journal(journal_dir(state_dir)).cursors()
    live = [c for c in cursors if c.model in models and c.age_s < LIVE_S]
    problems = sorted(f"{c.id}: {c.problem}" for c in live if c.problem)
    if problems:
        raise AssertionError("; ".join(problems))
    return f"{len(live)} live serving instance(s), none reports a problem"


def _ready(ok: bool) -> str:
    if not ok:
        raise AssertionError("not ready")
    return "ready"


def _model_ready(state: AdminState, name: str) -> str:
    return _ready(state.triton.model_ready(name))

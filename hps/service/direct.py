"""Writes without Kafka and warm-ups: L2/L3 written here, the instances told by the journal.

The control plane writes L3 (and a shared L2) itself, then appends an entry to the node's
change journal (:mod:`hps.updates.journal`): every serving process of the node applies it
within about 0.1 s (its L3 catches up, its L1 rows of those keys are re-read or evicted,
warm-up keys are loaded into L1), and the answer waits until every live instance of the
model has (at most :data:`APPLY_WAIT_S`): no instance restarts, and no reload leaks
tritonserver memory. A reload stays what changes a model's configuration
(``POST /v1/models/{model}/reload``).

A node that keeps no state (no L3, no shared L2: nothing here to write) has no journal;
there the former way is kept: the model is reloaded (:mod:`hps.service.ops`).
"""

from __future__ import annotations

import numpy as np

from hps.dedup import first_occurrences
from hps.errors import RequestError
from hps.loading.loader import Loader, TableSource, l2_action
from hps.service import ops
from hps.service.job_records import Job
from hps.service.state import AdminState
from hps.triton.repository import served_models
from hps.types import JSON, Keys, TableSpec
from hps.updates.journal import MAX_ENTRY_KEYS, Journal, Kind, journal_dir

APPLY_WAIT_S = 30.0


def journal(state: AdminState) -> Journal | None:
    """The node's change journal (None: the node keeps no state; writes reload instead)."""
    folder = state.topology.state_dir
    return None if folder is None else Journal(journal_dir(folder))


def _notify(state: AdminState, j: Journal, kind: Kind, table: str, keys: Keys | None) -> JSON:
    """Append the entry and wait for the model's live instances to apply it."""
    model = table.split(".", 1)[0]
    seq = j.append(kind, table, keys)
    applied, live = j.wait_applied(model, seq, APPLY_WAIT_S)
    expected = sum(s.instances for s in served_models(state.config) if s.hps_model == model)
    return {"via": "journal", "seq": seq, "instances": expected, "applied": applied, "live": live}


def delete(state: AdminState, spec: TableSpec, keys: Keys) -> JSON:
    """Remove ``keys`` from L3 and the shared L2, then from every instance's L1."""
    j = journal(state)
    if state.kafka or j is None:
        return ops.delete(state, spec, keys)
    with state.writer() as tiers:
        tiers.remove(spec.name, keys, durable=True)
    state.reset_reader()
    return {"deleted": int(keys.size), **_notify(state, j, "delete", spec.name, keys)}


def import_table(state: AdminState, job: Job, source: TableSource) -> JSON:
    """Load a validated source through the one loader; the instances re-read its keys."""
    j = journal(state)
    if state.kafka or j is None:
        return ops.import_table(state, job, source)
    spec = source.spec
    rate = state.config.volatile_db.initial_cache_rate
    with state.writer() as tiers:
        # the node's shared L2 loses the imported keys (read from L3 next); Redis is filled
        action = l2_action(state.topology, own=False)
        Loader(tiers, action, rate, on_rows=job.advance).load(source)
    state.reset_reader()
    keys = _source_keys(source) if source.rows <= MAX_ENTRY_KEYS else None  # None: all
    return _notify(state, j, "upsert", spec.name, keys)


def _source_keys(source: TableSource) -> Keys:
    """The distinct keys of a validated source (read from its keys file only)."""
    if source.kind == "sparse":
        keys = np.fromfile(source.files[0], dtype="<i8")
    else:
        keys = np.load(source.files[0], mmap_mode="r")
    return np.unique(np.asarray(keys, dtype=np.int64))


def warmup_keys(state: AdminState, model: str, keysets: dict[str, Keys]) -> JSON:
    """Load these keys per table into the L1 of every instance of ``model``."""
    j = journal(state)
    if j is None:
        return ops.warmup_keys(state, model, keysets)
    if not state.config.model(model).gpucache:
        raise RequestError(f"model {model!r} has no L1 (gpucache: false): nothing to warm up")
    if not any(k.size for k in keysets.values()):
        raise RequestError(f"warm-up of model {model!r} found no keys: nothing was loaded")
    out: JSON = {}
    for table, keys in keysets.items():  # the live version's table; hottest first kept
        out = _notify(state, j, "warmup", state.spec(model, table).name, first_occurrences(keys))
    return {"keys": {t: int(k.size) for t, k in keysets.items()}, **out}

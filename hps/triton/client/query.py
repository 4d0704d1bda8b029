"""``hps query``: one request to a served model, its answer printed as JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from hps.errors import RequestError, UnknownTableError
from hps.triton.client.inference import Client, ctr_request

INT64 = np.iinfo(np.int64)
UNKNOWN_ROWS = 1000  # a CTR request's keys are drawn below a table's rows; unknown: this


def parse_keys(keys: str) -> np.ndarray:
    """``--keys``: comma-separated int64 keys, at least one, no item empty (``1,,2`` is a
    typo, not the keys 1 and 2); a RequestError (status 2) otherwise."""
    items = [k.strip() for k in keys.split(",")]
    if not any(items):
        raise RequestError(f"--keys names no key ({keys!r}): give at least one, e.g. --keys 1,2,3")
    if "" in items:
        raise RequestError(
            f"--keys: item {items.index('') + 1} of {keys!r} is empty: give comma-separated "
            "integers, e.g. --keys 1,2,3"
        )
    try:
        parsed = [int(k) for k in items]
    except ValueError:
        raise RequestError(f"--keys must be comma-separated integers, got {keys!r}") from None
    if outside := [k for k in parsed if not INT64.min <= k <= INT64.max]:
        raise RequestError(
            f"--keys: {outside[0]} is outside the int64 range of keys ({INT64.min} .. {INT64.max})"
        )
    return np.array(parsed, dtype=np.int64)


@dataclass(frozen=True)
class RequestShape:
    """What a request of a served model needs: its tables in request order, and for a CTR
    model its dense features per sample and each table's rows (keys drawn below them)."""

    model: str
    tables: list[str]
    num_dense: int = 0
    rows: list[int] = field(default_factory=list)


def request_shape(client: Client, model: str, config: str | None) -> RequestShape:
    """The shape from the served model's parameters (its tables, written by ``hps serve``),
    so no ps.json is needed; from ``config``, a ps.json, when given, or when the model's
    repository predates those parameters (then from the ps.json its parameters name)."""
    params = client.model_parameters(model)
    hps_model = params.get("hps_model") or model
    if config is None and params.get("hps_tables"):
        tables = params["hps_tables"].split(",")
        num_dense = int(params.get("hps_num_dense") or 0)
        return RequestShape(hps_model, tables, num_dense, [UNKNOWN_ROWS] * len(tables))
    from hps.io.sparse_model import table_rows

    _, model_cfg = client.served_config(model, config)
    specs = model_cfg.tables
    rows = [table_rows(model_cfg, i, None) or UNKNOWN_ROWS for i in range(len(specs))]
    names = [s.table for s in specs]
    return RequestShape(model_cfg.model, names, model_cfg.maxnum_des_feature_per_sample, rows)


def query(
    url: str,
    model: str,
    *,
    grpc: bool = False,
    config: str | None = None,
    table: str | None = None,
    keys: str | None = None,
    samples: int = 2,
) -> Iterator[str]:
    """What ``hps query`` prints: one JSON object per key (or per sample of a CTR model)."""
    key_array = None if keys is None else parse_keys(keys)  # before anything is sent
    with Client(url, grpc=grpc) as client:
        shape = request_shape(client, model, config)
        names = shape.tables
        if "CATCOLUMN" in client.input_names(model):
            dense, cat, rowindex = ctr_request(
                samples, shape.num_dense, shape.rows, np.random.default_rng()
            )
            scores = client.predict(model, dense, cat, rowindex).reshape(-1)
            per_sample = cat.reshape(len(names), samples).T
            for i, score in enumerate(scores.tolist()):
                yield json.dumps({"sample": i, "keys": per_sample[i].tolist(), "score": score})
            return
        if key_array is None:
            raise RequestError("--keys is needed for an embedding model, e.g. --keys 1,2,3")
        if table is not None and table not in names:
            raise UnknownTableError(f"model {shape.model} has no table {table!r}; has {names}")
        index = names.index(table) if table is not None else 0
        numkeys = np.zeros(len(names), dtype=np.int32)
        numkeys[index] = key_array.size
        vectors = client.lookup(model, key_array, numkeys).reshape(key_array.size, -1)
        for k, v in zip(key_array.tolist(), vectors.tolist(), strict=True):
            yield json.dumps({"table": names[index], "key": k, "vector": [round(x, 6) for x in v]})

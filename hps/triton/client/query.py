"""``hps query``: one request to a served model, its answer printed as JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from hps.errors import RequestError, UnknownTableError
from hps.triton.client.inference import Client, ctr_request

INT64 = np.iinfo(np.int64)


def parse_keys(keys: str) -> np.ndarray:
    """``--keys``: comma-separated int64 keys, at least one; a RequestError (status 2)
    otherwise."""
    try:
        parsed = [int(k) for k in keys.split(",") if k.strip()]
    except ValueError:
        raise RequestError(f"--keys must be comma-separated integers, got {keys!r}") from None
    if not parsed:
        raise RequestError(f"--keys names no key ({keys!r}): give at least one, e.g. --keys 1,2,3")
    if outside := [k for k in parsed if not INT64.min <= k <= INT64.max]:
        raise RequestError(
            f"--keys: {outside[0]} is outside the int64 range of keys ({INT64.min} .. {INT64.max})"
        )
    return np.array(parsed, dtype=np.int64)


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
        _, model_cfg = client.served_config(model, config)
        specs = model_cfg.tables
        if "CATCOLUMN" in client.input_names(model):
            from hps.ctr.network import DenseNetwork
            from hps.io.sparse_model import table_rows

            rows = [table_rows(model_cfg, i, None) or 1000 for i in range(len(specs))]
            num_dense = DenseNetwork(model_cfg.dense_file, "numpy").num_dense
            dense, cat, rowindex = ctr_request(
                samples, [s.dim for s in specs], num_dense, rows, np.random.default_rng()
            )
            scores = client.predict(model, dense, cat, rowindex).reshape(-1)
            per_sample = cat.reshape(len(specs), samples).T
            for i, score in enumerate(scores.tolist()):
                yield json.dumps({"sample": i, "keys": per_sample[i].tolist(), "score": score})
            return
        if key_array is None:
            raise RequestError("--keys is needed for an embedding model, e.g. --keys 1,2,3")
        names = [s.table for s in specs]
        index = names.index(table) if table in names else 0
        if table is not None and table not in names:
            raise UnknownTableError(f"model {model_cfg.model} has no table {table!r}; has {names}")
        numkeys = np.zeros(len(specs), dtype=np.int32)
        numkeys[index] = key_array.size
        vectors = client.lookup(model, key_array, numkeys).reshape(key_array.size, -1)
        for k, v in zip(key_array.tolist(), vectors.tolist(), strict=True):
            yield json.dumps({"table": names[index], "key": k, "vector": [round(x, 6) for x in v]})

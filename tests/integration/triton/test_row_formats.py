"""A real tritonserver serving a model with an int8 and a float16 table
(docs/config.md: hps_row_dtype): OUTPUT0 is float32, within each format's bound of the
float32 source, the same from L2/L3 as from L1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model
from hps.rowformat import FORMATS
from hps.triton.client import Client
from hps.triton.repository import prepare_repository
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.server import TritonServer
from tests.fixtures.triton import table_data

pytestmark = pytest.mark.integration

TABLES = {"fmt": [("q8", 8, 200), ("h16", 4, 150)]}
DTYPES = ["int8", "float16"]


def test_quantized_tables_answer_float32_within_bound(tmp_path: Path) -> None:
    data = {}
    for i, (table, dim, rows) in enumerate(TABLES["fmt"]):
        keys, vectors = table_data(rows, dim, seed=70 + i)
        vectors *= 10  # a wider range than N(0, 1)
        write_sparse_model(tmp_path / "tables" / "fmt" / table, keys, vectors)
        data[f"fmt.{table}"] = (keys, vectors)
    doc = {
        "supportlonglong": True,
        "models": [
            {
                "model": "fmt",
                "sparse_files": [str(tmp_path / "tables" / "fmt" / t) for t, _, _ in TABLES["fmt"]],
                "embedding_table_names": [t for t, _, _ in TABLES["fmt"]],
                "embedding_vecsize_per_table": [d for _, d, _ in TABLES["fmt"]],
                "maxnum_catfeature_query_per_table_per_sample": [300, 300],
                "hps_row_dtype": DTYPES,
                "max_batch_size": 4,
                "gpucache": True,
                "hps_cache": {"device": "numpy"},
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
    }
    ps = tmp_path / "ps.json"
    ps.write_text(json.dumps(doc))
    config = serving_config(ps)
    names = prepare_repository(config, tmp_path / "repository", metrics_interval_s=0.0)
    prepare_tables(config)
    server = TritonServer(tmp_path / "repository", explicit=True, load_models=names)
    server.start()
    try:
        (k8, v8), (k16, v16) = data["fmt.q8"], data["fmt.h16"]
        keys = np.concatenate([k8, k16])
        with Client(server.http_url) as client:
            first = client.lookup("fmt", keys, [k8.size, k16.size])
            again = client.lookup("fmt", keys, [k8.size, k16.size])  # from L1 now
        assert first.dtype == np.float32 and first.shape == (1, k8.size * 8 + k16.size * 4)
        np.testing.assert_array_equal(again, first)
        got8 = first[0, : k8.size * 8].reshape(-1, 8)
        got16 = first[0, k8.size * 8 :].reshape(-1, 4)
        half_step = (v8.max(axis=1) - v8.min(axis=1)) / 510
        ulps = 4 * np.spacing(np.abs(v8).max(axis=1))
        assert (np.abs(got8 - v8) <= (half_step + ulps)[:, None]).all()
        assert np.abs(got8 - v8).max() > 0  # int8 really
        assert (np.abs(got16 - v16) <= np.abs(v16) * 2.0**-11 + 2.0**-24).all()
        np.testing.assert_array_equal(got16, v16.astype(np.float16).astype(np.float32))
        i8 = FORMATS["int8"]
        np.testing.assert_allclose(got8, i8.decode(i8.encode(v8), 8), rtol=1e-6, atol=1e-6)
    finally:
        assert not server.stop()

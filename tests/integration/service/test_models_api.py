"""Models added and removed at runtime through the control plane: `hps admin` under real
uvicorn beside a real `hps serve` (tritonserver) of the demo (two tables, and its CTR model),
with a second `hps admin` of the same node beside it.

Every vector of model ``extra`` (one table ``t``, dim 4) is ``[key, 7 + 10 * n, 0, 0]`` where
n counts its additions. Add it -> Triton serves it (`/v2/models/extra`), both control
planes list it and answer it in their lookup route and `/readyz` (no restart), the demo's
answers are unchanged; remove it -> not served, not listed, its rows kept in L3 (adding it
again is refused until it is purged); purge -> its column family gone; add it again -> served
as version 2. Refusals: 401 without the token, 422 for a bad entry, 409 for a served name
(its own or a Triton model's), 400 for a path outside the roots, 404 for an unknown model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rocksdict

from hps.io.sparse_model import write_sparse_model
from hps.triton.serving import serving_config
from tests.helpers import stop_by_pid
from tests.integration.service.helpers import triton_rows
from tests.integration.service.test_versions_api import (  # noqa: F401 (the fixture)
    TOKEN,
    Node,
    expected,
    node,
    start_admin,
)
from tests.integration.triton.test_runtime_models import served

pytestmark = pytest.mark.integration

ROWS, DIM = 100, 4
KEYS = np.array([3, 1, 4], np.int64)


def extra(site: Path, n: int) -> dict[str, Any]:
    """The entry of model ``extra`` for its ``n``-th addition; its table written under the
    ps.json's folder (a path root)."""
    folder = site / "demo" / f"extra{n}" / "t"
    keys = np.arange(ROWS, dtype=np.int64)
    vectors = np.zeros((ROWS, DIM), np.float32)
    vectors[:, 0], vectors[:, 1] = keys, 7 + 10 * n
    write_sparse_model(folder, keys, vectors)
    return {
        "model": "extra",
        "sparse_files": [str(folder)],
        "embedding_table_names": ["t"],
        "embedding_vecsize_per_table": [DIM],
        "maxnum_catfeature_query_per_table_per_sample": [4],
        "gpucache": True,
        "gpucacheper": 1.0,
    }


def want(n: int) -> list[list[float]]:
    return [[float(k), 7.0 + 10 * n, 0.0, 0.0] for k in KEYS]


def column_families(site: Path) -> list[str]:
    path = serving_config(site / "demo" / "ps.json", base_dir=site).persistent_db.path
    return list(rocksdict.Rdict.list_cf(path))


def holds_rows(site: Path, table: str) -> bool:
    """Whether L3 holds rows of ``table`` (a version 1 table dropped is emptied, not
    removed: docs/storage.md)."""
    path = serving_config(site / "demo" / "ps.json", base_dir=site).persistent_db.path
    names = rocksdict.Rdict.list_cf(path)
    if table not in names:
        return False
    raw = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(path, raw, column_families=dict.fromkeys(names, raw),
                         access_type=rocksdict.AccessType.read_only())  # fmt: skip
    try:
        return next(iter(db.get_column_family(table).keys()), None) is not None
    finally:
        db.close()


def add(plane: Node, body: dict[str, Any]) -> dict[str, Any]:
    status, queued = plane.call("POST", "/v1/models", body)
    assert status == 202 and queued["rows"] == ROWS, queued
    job = plane.job(queued["job"])
    assert job["state"] == "done" and job["kind"] == "add_model", job
    return dict(job["result"])


def listed(plane: Node) -> list[str]:
    status, body = plane.call("GET", "/v1/models")
    assert status == 200, body
    return [m["model"] for m in body["models"]]


def looked_up(plane: Node) -> list[list[float]]:
    status, found = plane.call("POST", "/v1/models/extra/tables/t/lookup", {"keys": KEYS.tolist()})
    assert status == 200, found
    return [r["vector"] for r in found["results"]]


def ready(plane: Node) -> list[str]:
    status, body = plane.call("GET", "/readyz")
    assert status == 200, json.dumps(body, indent=1)
    return [c["name"] for c in body["checks"]]


def test_models_added_and_removed_through_the_api(node: Node) -> None:  # noqa: F811
    site = node.site
    admin2, url2 = start_admin(site, node.triton, site / "admin2.log")  # the same node's
    try:
        other = Node(site, node.triton, url2)
        _added_removed_purged(node, other)
    finally:
        stop_by_pid(admin2)


def _added_removed_purged(plane: Node, other: Node) -> None:
    site = plane.site
    body = extra(site, 1)
    for token in (None, "wrong"):
        assert plane.call("POST", "/v1/models", body, token)[0] == 401
        assert plane.call("DELETE", "/v1/models/demo", None, token)[0] == 401
    for bad, status_want, says in [
        ({**body, "embedding_vecsize_per_table": [0]}, 422, "positive vector size"),
        ({**body, "sparse_files": ["/etc"]}, 400, "path not allowed or not found"),
        ({**body, "model": "demo"}, 409, "model 'demo' is served already"),
        ({**body, "model": "demo_ctr"}, 409, "Triton model 'demo_ctr'"),
    ]:
        status, err = plane.call("POST", "/v1/models", bad)
        assert status == status_want and says in json.dumps(err), err
    status, err = plane.call("DELETE", "/v1/models/nope")
    assert status == 404 and "unknown model 'nope'" in err["detail"], err
    before = plane.infer()

    result = add(plane, body)
    assert result == {"model": "extra", "version": 1, "state": "live", "triton_models": ["extra"]}
    assert served(plane.triton, "extra")
    rows = triton_rows(plane.triton, "extra", 1, 0, KEYS)
    np.testing.assert_array_equal(rows, np.array(want(1), np.float32))
    version, rows = plane.infer()  # the other models undisturbed
    assert version == before[0] == "1"
    np.testing.assert_array_equal(rows, expected(1))
    for cp in (plane, other):  # both control planes follow, without a restart
        assert listed(cp) == ["demo", "extra"]
        assert looked_up(cp) == want(1)
        assert "inference:extra" in ready(cp)
        status, one = cp.call("GET", "/v1/models/extra")
        assert status == 200 and one["tables"][0]["rows"]["l3"] == ROWS, one
    status, err = other.call("POST", "/v1/models", body)
    assert status == 409 and "served already" in err["detail"], err
    assert "extra.t" in column_families(site)

    status, done = other.call("DELETE", "/v1/models/extra")  # through the other one
    assert status == 200, done
    assert done == {
        "model": "extra", "served": False, "changed": True, "unloaded": ["extra"], "purged": [],
        "shared_rows_kept": [],
    }  # fmt: skip
    assert not served(plane.triton, "extra") and served(plane.triton, "demo")
    np.testing.assert_array_equal(plane.infer()[1], expected(1))
    for cp in (plane, other):
        assert listed(cp) == ["demo"]
        status, err = cp.call("POST", "/v1/models/extra/tables/t/lookup", {"keys": [1]})
        assert status == 404, err
        assert "inference:extra" not in ready(cp)
        assert cp.call("GET", "/v1/models/extra")[0] == 404
    assert holds_rows(site, "extra.t")  # its rows stay
    status, err = plane.call("POST", "/v1/models", extra(site, 2))
    assert status == 409 and "its rows are kept" in err["detail"], err

    status, done = plane.call("DELETE", "/v1/models/extra?purge=true")
    assert status == 200 and done["changed"] and done["purged"] == [1], done
    assert not holds_rows(site, "extra.t")

    result = add(plane, extra(site, 2))  # purged: the name may come back, numbers go on
    assert result["version"] == 2 and result["triton_models"] == ["extra"], result
    rows = triton_rows(plane.triton, "extra", 1, 0, KEYS)
    np.testing.assert_array_equal(rows, np.array(want(2), np.float32))
    for cp in (plane, other):
        assert listed(cp) == ["demo", "extra"]
        assert looked_up(cp) == want(2)
    status, done = plane.call("DELETE", "/v1/models/extra?purge=true")
    assert status == 200 and done["unloaded"] == ["extra"] and done["purged"] == [2], done
    assert "extra.t@2" not in column_families(site)
    assert not served(plane.triton, "extra")
    assert listed(other) == ["demo"]
    np.testing.assert_array_equal(plane.infer()[1], expected(1))

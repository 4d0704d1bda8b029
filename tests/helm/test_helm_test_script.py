"""The `helm test` pod's script (helm/hps/files/helm_test.py) against a real tritonserver."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from tests.fixtures.triton import TritonDeployment
from tests.helm.chart import CHART

pytestmark = pytest.mark.integration


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_test", CHART / "files" / "helm_test.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_passes_on_a_healthy_server(triton: TritonDeployment) -> None:
    ps = str(triton.root / "ps.json")
    assert _script().check(triton.server.http_url, ps, None) == []


def test_fails_on_wrong_vectors(triton: TritonDeployment) -> None:
    """These tables are not the demo's: asking for the demo's vectors must fail, per table."""
    ps = str(triton.root / "ps.json")
    failures = _script().check(triton.server.http_url, ps, 0)
    assert failures and all("differ from the demo's" in f for f in failures)
    assert len(failures) == sum(len(m.tables) for m in triton.config.models)

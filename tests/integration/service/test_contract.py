"""The OpenAPI contract, fuzzed with schemathesis against the ASGI app over a real Triton.

Every operation: no 5xx, only documented statuses and bodies, and auth enforced (the
mutating operations declare the bearer scheme; schemathesis replays them without it and
expects 401). Random path parameters name no configured model, so mutations stay cheap.

The apps are built at import (schemathesis reads their schema then); a fixture points them
at the real deployment before the first case runs.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from hps.config import parse_config
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from tests.integration.service.conftest import TOKEN, Stack

pytestmark = pytest.mark.integration

_placeholder = parse_config(
    {"models": [{"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4]}]}
)
_scratch = Path(tempfile.mkdtemp(prefix="hps-test-contract-"))  # the placeholders' state
open_app = create_app(
    AdminState(_placeholder, TOKEN, TritonAdmin("127.0.0.1:1"), state_dir=_scratch / "open")
)
closed_app = create_app(
    AdminState(_placeholder, None, TritonAdmin("127.0.0.1:1"), state_dir=_scratch / "closed")
)
schema = schemathesis.openapi.from_asgi("/openapi.json", open_app)
closed = schemathesis.openapi.from_asgi("/openapi.json", closed_app)


@pytest.fixture(scope="module", autouse=True)
def _deployed(stack: Stack) -> Iterator[None]:
    states = [stack.state(), stack.state(token=None)]
    for app, state in zip((open_app, closed_app), states, strict=True):
        app.state.hps.close()
        app.state.hps = state
    shutil.rmtree(_scratch, ignore_errors=True)
    yield
    for state in states:
        state.close()


# A schema-valid model entry may still be refused (400, 422): the files it names are
# checked on the server, and the ps.json's rules across keys (one sparse file and one
# table name per vector size, ...) are beyond JSON Schema.
REFUSES_SCHEMA_VALID = {("POST", "/v1/models")}


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_contract(case: Any) -> None:
    excluded = []
    if (case.method.upper(), case.path) in REFUSES_SCHEMA_VALID:
        excluded.append(positive_data_acceptance)
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, excluded_checks=excluded)


@closed.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_token_configured_refuses_mutations(case: Any) -> None:
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
    if case.method.upper() in ("POST", "PUT", "PATCH", "DELETE"):
        assert response.status_code == 403, response.text
        assert response.json()["error"] == "Forbidden"
    else:
        assert response.status_code < 500

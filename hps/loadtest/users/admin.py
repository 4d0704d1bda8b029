"""The user of the control plane's read routes (``hps admin``), when ``--admin-url`` is given."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
from locust import FastHttpUser, constant, task

from hps.loadtest.users.shared import STATE


class AdminReader(FastHttpUser):
    """GETs the readiness, the model list and a table's info; checks the answers' bodies."""

    fixed_count = 1
    wait_time = constant(0.2)

    def on_start(self) -> None:
        self.work = STATE.work()
        self.rng = np.random.default_rng()

    def _get(self, path: str, name: str, check: Callable[[object], None]) -> None:
        with self.rest("GET", path, name=name) as resp:  # request type: "GET <route>"
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {(resp.text or '')[:200]}")
            elif resp.js is None:
                resp.failure("not JSON")
            else:
                try:
                    check(resp.js)
                except (AssertionError, KeyError, TypeError) as exc:
                    resp.failure(f"unexpected body: {exc}")

    @task
    def readyz(self) -> None:
        self._get("/readyz", "/readyz", lambda body: None)

    @task
    def models(self) -> None:
        self._get("/v1/models", "/v1/models", lambda body: _assert_in(self.work.name, body))

    @task(2)
    def table(self) -> None:
        t = self.work.tables[int(self.rng.integers(0, len(self.work.tables)))]
        path = f"/v1/models/{self.work.name}/tables/{t.spec.table}"

        def check(body: object) -> None:
            if isinstance(body, dict) and "dim" in body:
                assert body["dim"] == t.spec.dim, f"dim {body['dim']} != {t.spec.dim}"

        self._get(path, "/v1/models/{model}/tables/{table}", check)


def _assert_in(name: str, body: object) -> None:
    assert name in json.dumps(body), f"model {name!r} not listed"

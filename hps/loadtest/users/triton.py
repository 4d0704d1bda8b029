"""Users that talk to Triton: HPS lookups over gRPC and HTTP, the CTR model, bad requests.

Every answer is checked: a wrong vector or score is a failure (:class:`WrongAnswer`), and so
is a malformed request that Triton does not refuse as malformed (INVALID_ARGUMENT).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from locust import User, constant, task

from hps.loadtest.requests import WrongAnswer, check_refused
from hps.loadtest.users.shared import STATE, fire
from hps.loadtest.workload import Workload


class TritonUser(User):
    """A reader with its own tritonclient connection (closed in on_stop)."""

    abstract = True
    wait_time = constant(0)
    protocol = "grpc"

    def on_start(self) -> None:
        from hps.triton.client import Client

        o = self.environment.parsed_options
        assert o is not None
        url = o.triton_grpc if self.protocol == "grpc" else o.triton_http
        self.client = Client(url, grpc=self.protocol == "grpc")
        self.work: Workload = STATE.work()
        self.rng = np.random.default_rng()

    def on_stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()  # else Locust hangs at exit in the gRPC channel's __del__

    def lookup(self) -> int:
        req = self.work.lookup_request(self.rng)
        out = self.client.infer(self.work.name, req.inputs)
        req.check(out)
        return int(out.nbytes)


class GrpcReader(TritonUser):
    @task
    def read(self) -> None:
        fire(self.environment, "grpc", "lookup", self.lookup)


class HttpReader(TritonUser):
    protocol = "http"

    @task
    def read(self) -> None:
        fire(self.environment, "http", "lookup", self.lookup)


class CtrReader(TritonUser):
    """The example CTR model ``<model>_ctr`` (lookup, pooling and the dense network)."""

    @task
    def predict(self) -> None:
        def call() -> int:
            req = self.work.ctr_request(self.rng)
            out = self.client.infer(f"{self.work.name}_ctr", req.inputs)
            req.check(out)
            return int(out.nbytes)

        fire(self.environment, "grpc", "ctr", call)


class BadRequester(TritonUser):
    """A few malformed requests: each must be refused as malformed, with gRPC
    ``INVALID_ARGUMENT`` (:func:`hps.loadtest.requests.check_refused`), nothing else: a
    server error is no refusal. tritonclient's own error is read, not its translation to
    ``hps.errors`` (which counts server errors as ``RequestError`` too)."""

    wait_time = constant(0.5)

    @task
    def bad(self) -> None:
        from tritonclient.utils import InferenceServerException

        bad = self.work.bad_requests()
        what, inputs = bad[int(self.rng.integers(0, len(bad)))]
        tensors = _tensors(self.client.module, inputs)

        def call() -> int:
            try:
                self.client.client.infer(self.work.name, tensors)
            except InferenceServerException as exc:
                check_refused(what, str(exc.status() or ""), str(exc.message() or ""))
                return 0  # refused as it should be
            raise WrongAnswer(f"{what}: Triton accepted a malformed request")

        fire(self.environment, "grpc", "bad request", call)


def _tensors(module: ModuleType, inputs: dict[str, np.ndarray]) -> list[Any]:
    """tritonclient's ``InferInput`` of each array (``module``: tritonclient.grpc or .http)."""
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out

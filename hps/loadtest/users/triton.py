"""Users that talk to Triton: HPS lookups over gRPC and HTTP, the CTR model, bad requests.

Every answer is checked: a wrong vector or score is a failure (:class:`WrongAnswer`), and so
is a malformed request that Triton does not refuse with a client error.
"""

from __future__ import annotations

import numpy as np
from locust import User, constant, task

from hps.loadtest.requests import WrongAnswer
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
    """A few malformed requests: each must be refused with a client error, nothing else."""

    wait_time = constant(0.5)

    @task
    def bad(self) -> None:
        from hps.errors import RequestError, UnknownTableError

        bad = self.work.bad_requests()
        what, inputs = bad[int(self.rng.integers(0, len(bad)))]

        def call() -> int:
            try:
                self.client.infer(self.work.name, inputs)
            except UnknownTableError as exc:
                raise WrongAnswer(f"{what}: refused as unknown model: {exc}") from None
            except RequestError:
                return 0  # refused as it should be
            raise WrongAnswer(f"{what}: Triton accepted a malformed request")

        fire(self.environment, "grpc", "bad request", call)

"""What the users of one Locust process share: the run's state, and timing a call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from locust.env import Environment

from hps.loadtest.steps import StageRecorder
from hps.loadtest.thresholds import Thresholds
from hps.loadtest.workload import Workload

READ_TYPES = {"grpc lookup", "http lookup", "grpc ctr"}


@dataclass
class RunState:
    """Set by the locustfile's init event (when ``--hps-config`` is given), read by users."""

    workload: Workload | None = None
    thresholds: Thresholds | None = None
    recorder: StageRecorder | None = None
    started: float | None = None  # monotonic time of the load shape's first tick
    exception_types: dict[str, str] = field(default_factory=dict)  # traceback -> type name

    def work(self) -> Workload:
        if self.workload is None:
            raise RuntimeError("no workload: run the users with --hps-config")
        return self.workload

    def elapsed(self) -> float:
        """Seconds since the load shape started (0 before)."""
        return 0.0 if self.started is None else time.monotonic() - self.started


STATE = RunState()


def fire(env: Environment, rtype: str, name: str, call: Callable[[], int]) -> None:
    """Time ``call`` (it returns the response length) and report it to Locust."""
    start = time.perf_counter()
    exc: BaseException | None = None
    length = 0
    try:
        length = call()
    except Exception as e:  # every failure is reported to Locust, none ends the user
        exc = e
    report(env, rtype, name, time.perf_counter() - start, length, exc)


def report(
    env: Environment,
    rtype: str,
    name: str,
    seconds: float,
    length: int = 0,
    exc: BaseException | None = None,
) -> None:
    """Report one timed request (or the failure ``exc``) to Locust."""
    env.events.request.fire(
        request_type=rtype, name=name, response_time=seconds * 1e3,
        response_length=length, exception=exc, context={},
    )  # fmt: skip

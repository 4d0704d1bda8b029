"""The FastAPI application: errors mapped to statuses in one place, metrics, the routes.

``create_app(state)`` builds it; ``hps admin`` serves it with uvicorn. Every core error
(:class:`hps.errors.HPSError`) answers with :func:`hps.errors.http_status` (the one mapping,
which Triton's models share) and a body naming what is wrong.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException

from hps.errors import HPSError, QueueFullError, http_status
from hps.redact import redact_mapping
from hps.service.connections import READ_TIMEOUT_S, ConnectionGuard
from hps.service.limits import BodyTimeout, TokenAndBodyLimits, TooLarge
from hps.service.state import AdminState

log = logging.getLogger(__name__)
MAX_VALIDATION_ERRORS = 20  # the most a 422 lists; past them it says how many more


class Metrics:
    """The control plane's own Prometheus metrics (``GET /metrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hps_admin_requests_total",
            "Requests answered",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hps_admin_request_seconds", "Time to answer", ["route"], registry=self.registry
        )
        self.errors = Counter(
            "hps_admin_core_errors_total", "Core errors by type", ["error"], registry=self.registry
        )

    def watch(self, state: AdminState, guard: ConnectionGuard | None) -> None:
        """Gauges read when scraped: the job queue, and the connection guard's counts."""
        jobs = state.jobs
        queue = Gauge("hps_admin_jobs_pending", "Jobs queued or running", registry=self.registry)
        queue.set_function(lambda: float(jobs.load()[0]))
        staged = Gauge(
            "hps_admin_staged_bytes", "Upload bytes staged for pending jobs", registry=self.registry
        )
        staged.set_function(lambda: float(jobs.load()[1]))
        reloads = Gauge(
            "hps_admin_model_loads",
            "Model loads run (coalesced reloads count once)",
            registry=self.registry,
        )
        reloads.set_function(lambda: float(state.triton.reloads.loads))
        if guard is None:
            return
        conns = Gauge("hps_admin_connections", "Open connections", registry=self.registry)
        conns.set_function(lambda: float(guard.open))
        closed = Gauge(
            "hps_admin_connections_closed",
            "Connections closed by the guard, by reason (since start)",
            ["reason"],
            registry=self.registry,
        )
        closed.labels("evicted").set_function(lambda: float(guard.evicted))
        closed.labels("refused").set_function(lambda: float(guard.refused))
        closed.labels("read_timeout").set_function(lambda: float(guard.timed_out))
        closed.labels("stalled").set_function(lambda: float(guard.stalled))


# A client chooses its request's method: any other is counted as "other", so that requests
# cannot add series to /metrics without bound.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _error(
    status: int, kind: str, detail: object, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An error body; registered secrets (hps.redact) are scrubbed from what it says."""
    body = redact_mapping({"error": kind, "detail": detail})
    return JSONResponse(body, status_code=status, headers=headers)


def _allowed(app: FastAPI, request: Request) -> list[str]:
    """The methods of every route at the request's path (a path may have several routes:
    ``GET`` and ``POST /v1/models/{model}/versions``)."""
    from starlette.routing import Match

    def flat(routes: list[Any]) -> Iterator[Any]:
        for route in routes:  # FastAPI keeps an included router (no prefix here) as one route
            inner = getattr(route, "original_router", None)
            yield from flat(inner.routes) if inner is not None else (route,)

    methods: set[str] = set()
    for route in flat(app.router.routes):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def create_app(state: AdminState, guard: ConnectionGuard | None = None) -> FastAPI:
    """The application; ``guard``: the connection guard it is served with (its counts go
    to ``/metrics``)."""
    from hps.service import model_routes, mutations, routes, version_routes

    metrics = Metrics()
    metrics.watch(state, guard)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from hps.updates.shared_record import RecordPublisher

        state.jobs.reopen()  # a no-op unless a previous lifespan closed it (tests)
        # a Redis L2 may be fed by a consumer of its own, which routes by the nodes' records
        shared = RecordPublisher(state.base) if state.topology.l2 == "server" else None
        if shared is not None:
            shared.start()
        yield
        if shared is not None:
            shared.close()
        state.close()

    app = FastAPI(
        title="HPS control plane",
        version="1",
        description="Health, stats, import, lookup, delete, warm-up and reload of HPS tables; "
        "models added and removed at runtime; model versions (import, activate, retire).",
        lifespan=lifespan,
    )
    app.state.hps = state
    app.state.metrics = metrics

    @app.exception_handler(HPSError)
    async def core_error(request: Request, exc: HPSError) -> JSONResponse:
        metrics.errors.labels(type(exc).__name__).inc()
        status = http_status(exc)
        if status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        headers = None
        if isinstance(exc, QueueFullError):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return _error(status, type(exc).__name__, str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        detail: list[dict[str, object]] = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", "")}
            for e in errors[:MAX_VALIDATION_ERRORS]
        ]
        if len(errors) > MAX_VALIDATION_ERRORS:  # a list of a million bad items: not echoed
            more = len(errors) - MAX_VALIDATION_ERRORS
            detail.append({"loc": [], "msg": f"and {more:,} more errors"})
        return _error(422, "ValidationError", detail)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the first route's methods only
            headers["Allow"] = ", ".join(_allowed(app, request))
        return _error(exc.status_code, "HTTPError", exc.detail, headers)

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, exc: TooLarge) -> JSONResponse:
        return _error(413, "TooLarge", str(exc) or "request body too large")

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> JSONResponse:
        return _error(408, "BodyTimeout", str(exc))

    # inside `count`: refusals are counted too
    read_timeout_s = guard.read_timeout_s if guard is not None else READ_TIMEOUT_S
    app.add_middleware(
        TokenAndBodyLimits, token=state.token, jobs=state.jobs, read_timeout_s=read_timeout_s
    )

    @app.middleware("http")
    async def count(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response: Response = await call_next(request)
        route = request.scope.get("route")
        name = getattr(route, "path", "refused_or_unmatched")
        method = request.method if request.method in HTTP_METHODS else "other"
        metrics.requests.labels(name, method, str(response.status_code)).inc()
        metrics.latency.labels(name).observe(time.perf_counter() - start)
        return response

    @app.get("/metrics", response_class=Response, tags=["health"])
    def prometheus() -> Response:
        """The control plane's own metrics, Prometheus text format."""
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    app.include_router(routes.router)
    app.include_router(mutations.router)
    app.include_router(version_routes.router)
    app.include_router(model_routes.router)
    return app

"""The FastAPI application: errors mapped to statuses in one place, metrics, the routes.

``create_app(state)`` builds it; ``hps admin`` serves it with uvicorn. Every core error
(:class:`hps.errors.HPSError`) answers with :func:`hps.errors.http_status` (the one mapping,
which Triton's models share) and a body naming what is wrong.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote_plus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hps.errors import HPSError, QueueFullError, http_status
from hps.redact import redact_mapping, registered
from hps.service.connections import READ_TIMEOUT_S, ConnectionGuard
from hps.service.limits import BodyTimeout, TokenAndBodyLimits, TooLarge
from hps.service.state import AdminState
from hps.service.upload_form import CLIENT_TEXT

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
    request: Request,
    status: int,
    kind: str,
    detail: object,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error body; registered secrets (hps.redact) are scrubbed from what it says, but
    those the request carried itself (:func:`client_sent`): an error that echoes a name
    the client sent answers the same whether or not that name is a secret, so that no
    guess of a client is told apart by a ``<redacted>``."""
    body: dict[str, object] = {"error": kind, "detail": detail}
    scrubbed = redact_mapping(body)
    if scrubbed != body:  # a registered secret in what it says: did the client send it?
        scrubbed = redact_mapping(body, keep=client_sent(request, registered()))
    return JSONResponse(scrubbed, status_code=status, headers=headers)


def client_sent(request: Request, secrets: Iterable[str]) -> set[str]:
    """Those of ``secrets`` the request carried: in its path or query string (as sent and
    decoded), its JSON body as read by the route (its strings, keys included, as decoded,
    or the bytes of a body that did not parse) or its form's text (:data:`CLIENT_TEXT`)."""
    scope = request.scope
    query = scope.get("query_string", b"").decode("latin-1")
    texts = [
        scope.get("path", ""),
        scope.get("raw_path", b"").decode("latin-1"),
        query,
        unquote_plus(query),
        *scope.get(CLIENT_TEXT, ()),
    ]
    # what the route read of the body: Starlette's Request keeps both, and the exception
    # handlers get the route's Request
    parsed = getattr(request, "_json", None)
    if parsed is not None:
        texts.extend(_strings(parsed))
    elif isinstance(body := getattr(request, "_body", None), bytes):
        texts.append(body.decode("utf-8", "replace"))
    return {s for s in secrets if any(s in text for text in texts)}


def _strings(doc: object) -> Iterator[str]:
    """Every string of a JSON document, its objects' keys included."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


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


class Counting:
    """Counts every request answered, by route, method and status, and its time (ASGI
    middleware: a request left unanswered, its client gone mid-body, is counted with status
    ``499`` and costs no log line)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 499  # no answer: the client left before one was sent

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except BaseException:
            status = 500 if status == 499 else status
            raise
        finally:
            route = scope.get("route")  # the router sets it in the request's scope
            name = getattr(route, "path", "refused_or_unmatched")
            method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
            self.metrics.requests.labels(name, method, str(status)).inc()
            self.metrics.latency.labels(name).observe(time.perf_counter() - start)


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
        return _error(request, status, type(exc).__name__, str(exc), headers)

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
        return _error(request, 422, "ValidationError", detail)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the first route's methods only
            headers["Allow"] = ", ".join(_allowed(app, request))
        return _error(request, exc.status_code, "HTTPError", exc.detail, headers)

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, exc: TooLarge) -> JSONResponse:
        return _error(request, 413, "TooLarge", exc.detail)

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> JSONResponse:
        return _error(request, 408, "BodyTimeout", exc.detail)

    read_timeout_s = guard.read_timeout_s if guard is not None else READ_TIMEOUT_S
    app.add_middleware(
        TokenAndBodyLimits, token=state.token, jobs=state.jobs, read_timeout_s=read_timeout_s
    )

    app.add_middleware(Counting, metrics=metrics)  # outermost: refusals are counted too

    @app.get("/metrics", response_class=Response, tags=["health"])
    def prometheus() -> Response:
        """The control plane's own metrics, Prometheus text format."""
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    app.include_router(routes.router)
    app.include_router(mutations.router)
    app.include_router(version_routes.router)
    app.include_router(model_routes.router)
    return app

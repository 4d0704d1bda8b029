"""Limits of the control plane: what a client may send, checked before it costs much.

:class:`TokenAndBodyLimits` (ASGI middleware): the bearer token check, request body size
limits, and the job queue's admission of an import. All act before a body is read: an
unauthenticated upload is refused without spooling it, a body over its limit gets 413 as
soon as the limit is crossed, and an import past the queue's limits (count or staged
bytes, :mod:`hps.service.jobs`) gets 429 with ``Retry-After`` before its upload is read
(a chunked upload, of no announced length, as soon as what it sent passes the budget).
The JSON bodies of the routes that take lists of keys are limited to what their most keys
take (:data:`KEY_JSON_BYTES` a key): a lookup of 30 million keys is refused before its
57 MiB are parsed (seconds on the event loop, and hundreds of MB), not after.

What a client may *hold* (connections) is :mod:`hps.service.connections`.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hps.errors import HPSError, QueueFullError
from hps.service.auth import check_bearer
from hps.service.connections import READ_TIMEOUT_S
from hps.service.schemas import MAX_LOOKUP_KEYS, MAX_WRITE_KEYS

if TYPE_CHECKING:
    from hps.service.jobs import JobRegistry, Reservation

log = logging.getLogger(__name__)

MAX_JSON_BYTES = 64 * 1024**2  # a JSON body of a route not in ROUTE_JSON_LIMITS
MAX_UPLOAD_BYTES = 64 * 1024**3
# Room for one int64 key in a JSON list: 20 characters (a sign and 19 digits), a separator
# and a pretty-printer's line break and indentation.
KEY_JSON_BYTES = 32
LOOKUP_JSON_BYTES = 1024**2  # MAX_LOOKUP_KEYS (10,000) keys take at most 320,000 bytes
WRITE_KEYS_JSON_BYTES = 32 * 1024**2  # MAX_WRITE_KEYS (1,000,000) take at most 32,000,000
MODEL_JSON_BYTES = 1024**2  # a model entry: MAX_TABLES tables' paths and sizes fit
# A version import: MAX_PER_TABLE (1,024) sparse folders of MAX_PATH_CHARS (4,096) each,
# with quotes, separator and indentation (4.2 MB), a dense file, one row format and one
# size per table (32 bytes each, 66 KB)
VERSION_JSON_BYTES = 5 * 1024**2
MIN_BODY_RATE = 64 * 1024  # bytes/s a body must come at, past the read timeout
_MODEL = r"/v1/models/[^/]+"
_TABLE = _MODEL + r"/tables/[^/]+"
# (method, path, limit, what a 413 says of it): the routes whose bodies are lists of keys,
# the model entry of a model added at runtime and a version import
ROUTE_JSON_LIMITS: tuple[tuple[str, re.Pattern[str], int, str], ...] = (
    ("POST", re.compile(_TABLE + "/lookup"), LOOKUP_JSON_BYTES, f"{MAX_LOOKUP_KEYS:,} keys"),
    ("DELETE", re.compile(_TABLE + "/keys"), WRITE_KEYS_JSON_BYTES, f"{MAX_WRITE_KEYS:,} keys"),
    ("POST", re.compile(_MODEL + "/warmup"), WRITE_KEYS_JSON_BYTES, f"{MAX_WRITE_KEYS:,} keys"),
    ("POST", re.compile(r"/v1/models"), MODEL_JSON_BYTES, "one model entry"),
    ("POST", re.compile(_MODEL + "/versions"), VERSION_JSON_BYTES, "one version import"),
)
MUTATING_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MESSAGES = {
    401: "missing or wrong bearer token",
    403: "mutations are disabled: no admin token is configured (--token-file, HPS_ADMIN_TOKEN)",
    413: "request body too large",
}
KINDS = {
    401: "Unauthorized",
    408: "BodyTimeout",
    403: "Forbidden",
    404: "HTTPError",
    413: "TooLarge",
    429: "QueueFullError",
    503: "BackendUnavailable",
}


class TooLarge(HTTPException):
    """A body crossed its limit while read: a 413, ``detail`` naming the limit.

    HTTP exceptions, so that a route's body parsing (FastAPI's, which makes any other
    exception of a body read a 400) lets them through to their answer."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class BodyTimeout(HTTPException):
    """A body that stopped for the read timeout, or came slower than the read timeout plus
    1 s per :data:`MIN_BODY_RATE` bytes: a 408, ``detail`` saying which."""

    def __init__(self, detail: str) -> None:
        super().__init__(408, detail)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:,} bytes"


async def _answer(
    send: Send, status: int, detail: str | None = None, retry_after_s: int | None = None
) -> None:
    body = json.dumps({"error": KINDS[status], "detail": detail or MESSAGES[status]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TokenAndBodyLimits:
    """Token check for every POST/PUT/PATCH/DELETE, body limits (uploads: ``upload_limit``,
    at most the job queue's staged bytes; the key-list routes: :data:`ROUTE_JSON_LIMITS`;
    other JSON bodies: ``json_limit``) and the job queue's admission of imports. A 413's
    detail names the limit."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        json_limit: int = MAX_JSON_BYTES,
        upload_limit: int = MAX_UPLOAD_BYTES,
        read_timeout_s: float = READ_TIMEOUT_S,
        jobs: JobRegistry | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.json_limit = json_limit
        self.upload_limit = upload_limit
        self.read_timeout_s = read_timeout_s
        self.jobs = jobs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] in MUTATING_METHODS:
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            refused = check_bearer(self.token, auth)
            if refused is not None:
                await _answer(send, refused)
                return
        if _CONTROL.search(scope["path"]):
            # no route's: a route's pattern ends in `$`, which matches before a final newline,
            # and the limits chosen below by the path would not be those of the route it reached
            await _answer(send, 404, "Not Found: the path holds a control character")
            return
        is_import = scope["method"] == "POST" and scope["path"].endswith("/import")
        limit, refusal = self.body_limit(scope["method"], scope["path"])
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _answer(send, 413, refusal)
            return
        if not is_import or self.jobs is None:
            await self._limited(scope, receive, send, limit, refusal)
            return
        try:  # a place in the job queue before the upload is read
            res = self.jobs.reserve(int(length) if length is not None and length.isdigit() else 0)
        except QueueFullError as exc:
            await _answer(send, 429, str(exc), exc.retry_after_s)
            return
        except HPSError as exc:  # shutting down
            await _answer(send, 503, str(exc))
            return
        with self.jobs.holding(res):
            await self._limited(scope, receive, send, limit, refusal, res)

    def body_limit(self, method: str, path: str) -> tuple[int, str]:
        """The most bytes a request's body may take, and the 413's detail past it."""
        if path.endswith("/import"):
            limit = self.upload_limit
            if method == "POST" and self.jobs is not None:
                limit = min(limit, self.jobs.max_staged_bytes)
            return limit, f"request body too large: an upload takes at most {_size(limit)}"
        for route_method, pattern, route_limit, keys in ROUTE_JSON_LIMITS:
            if method == route_method and pattern.fullmatch(path):
                limit = min(route_limit, self.json_limit)
                return limit, (
                    f"request body too large: this route takes at most {keys}, "
                    f"its JSON body at most {_size(limit)}"
                )
        limit = self.json_limit
        return limit, f"request body too large: a JSON body takes at most {_size(limit)}"

    async def _limited(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        limit: int,
        refusal: str,
        res: Reservation | None = None,
    ) -> None:
        seen = 0
        started = False
        body_done = False  # then a receive waits for a disconnect: no timeout
        since = last = anyio.current_time()

        async def counted() -> Message:
            nonlocal seen, body_done, last
            if body_done:
                return await receive()
            # the body's deadline: the read timeout, and as long again as its bytes take at
            # MIN_BODY_RATE (a trickle, each byte within the timeout, held its connection);
            # and a body that stops: the read timeout after its last bytes (else a stalled
            # upload would hold its staged budget, and the shutdown, 1 s per 64 KiB it sent)
            rate = since + self.read_timeout_s + seen / MIN_BODY_RATE
            try:
                with anyio.fail_at(min(rate, last + self.read_timeout_s)):
                    message = await receive()
            except TimeoutError:
                stalled = anyio.current_time() < rate
                raise BodyTimeout(
                    f"request body stopped: nothing for {self.read_timeout_s:g} s after "
                    f"{seen:,} bytes"
                    if stalled
                    else f"request body too slow: {seen:,} bytes in {self.read_timeout_s:g} s "
                    f"plus 1 s per {_size(MIN_BODY_RATE)} received"
                ) from None
            last = anyio.current_time()
            body_done = message["type"] != "http.request" or not message.get("more_body")
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise TooLarge(refusal)
                if res is not None and seen > res.nbytes and self.jobs is not None:
                    self.jobs.grow(res, seen)  # a chunked upload: QueueFullError past the budget
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except TooLarge:
            if not started:
                await _answer(send, 413, refusal)
        except BodyTimeout as exc:
            if not started:
                await _answer(send, 408, exc.detail)
        except ClientDisconnect:  # gone mid-body: no one to answer, nothing worth a log line
            log.debug("%s %s: the client left before its body ended", scope["method"],
                      scope["path"])  # fmt: skip

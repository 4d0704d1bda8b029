"""ASGI middleware (:class:`TokenAndBodyLimits`): the bearer token check and request body
size limits.

Both act before a body is read: an unauthenticated upload is refused without spooling it,
and a body over its limit gets 413 as soon as the limit is crossed.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hps.service.auth import check_bearer

MAX_JSON_BYTES = 64 * 1024**2
MAX_UPLOAD_BYTES = 64 * 1024**3
MUTATING_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
MESSAGES = {
    401: "missing or wrong bearer token",
    403: "mutations are disabled: no admin token is configured (--token-file, HPS_ADMIN_TOKEN)",
    413: "request body too large",
}


class TooLarge(Exception):
    pass


async def _answer(send: Send, status: int) -> None:
    kind = {401: "Unauthorized", 403: "Forbidden", 413: "TooLarge"}[status]
    body = json.dumps({"error": kind, "detail": MESSAGES[status]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TokenAndBodyLimits:
    """Token check for every POST/PUT/PATCH/DELETE, and body limits (uploads: ``upload_limit``)."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        json_limit: int = MAX_JSON_BYTES,
        upload_limit: int = MAX_UPLOAD_BYTES,
    ) -> None:
        self.app = app
        self.token = token
        self.json_limit = json_limit
        self.upload_limit = upload_limit

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
        limit = self.upload_limit if scope["path"].endswith("/import") else self.json_limit
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _answer(send, 413)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise TooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except TooLarge:
            if not started:
                await _answer(send, 413)

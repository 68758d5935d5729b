"""ASGI middleware of the server: request counting, authentication and a body size limit.

All three are plain ASGI (no request object, no buffering beyond the body limit) and
answer in OpenAI's error format.
"""

from __future__ import annotations

import codecs
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.routing import Match, Router

from inferscale_memory.server.auth import ANONYMOUS, ApiKeys
from inferscale_memory.server.errors import APIError
from inferscale_memory.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)
Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
PROTECTED_PREFIX = "/v1"
CLIENT_CLOSED = 499  # nginx's status for a client that went away before the response


async def send_error(send: Send, error: APIError) -> None:
    """Send ``error`` as a complete JSON response."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestCounter:
    """Counts HTTP requests by route template, method and status code.

    A request answered before routing (a 401, a 413) is counted under the route its path
    matches; one whose client went away before any response (mid-upload) as 499, not as
    a server error; an exception that escapes the app as 500.

    Args:
        app: The wrapped ASGI app.
        metrics: Where the counter lives.
        router: The app's router (its routes name the requests).
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, router: Router) -> None:
        self.app = app
        self.metrics = metrics
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int | None] = [None]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException:
            status[0] = status[0] or 500
            raise
        finally:
            code = str(status[0] or CLIENT_CLOSED)
            self.metrics.requests.labels(self._route(scope), scope["method"], code).inc()

    def _route(self, scope: Scope) -> str:
        """The template of the route that served (or would serve) the request."""
        route = getattr(scope.get("route"), "path", None)
        if route is not None:
            return str(route)
        for candidate in self.router.routes:
            if candidate.matches(scope)[0] != Match.NONE:
                return str(getattr(candidate, "path", "unmatched"))
        return "unmatched"


class Authentication:
    """Resolves the ``Authorization: Bearer`` key of ``/v1`` requests to a principal.

    The principal goes to ``request.state.principal``; requests without a valid key get a
    401 before their body is read, and requests with two ``Authorization`` headers a 400.
    Without keys every request is anonymous and allowed.

    Args:
        app: The wrapped ASGI app.
        keys: The API keys, or ``None`` for no authentication.
    """

    def __init__(self, app: ASGIApp, keys: ApiKeys | None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal = ANONYMOUS
        path = scope.get("path", "")
        if self.keys is not None and (path == PROTECTED_PREFIX
                                      or path.startswith(PROTECTED_PREFIX + "/")):
            headers = _headers(scope, b"authorization")
            try:
                if len(headers) > 1:  # a proxy that reads the other one would disagree
                    raise APIError(400, "the request has more than one Authorization header; "
                                   "send one", code="multiple_authorization_headers")
                principal = self.keys.authenticate(headers[0] if headers else None)
            except APIError as error:
                await send_error(send, error)
                return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


class BodyLimit:
    """Rejects request bodies over ``max_bytes`` with a 413 and bodies that start with a
    byte order mark with a 400 (JSON must not have one: RFC 8259), then replays the rest.

    An oversized body is read and discarded (up to ``drain_bytes``) before the 413 is
    sent, so that clients that send the whole body before reading still see the answer.

    Args:
        app: The wrapped ASGI app.
        max_bytes: Largest accepted body.
        drain_bytes: Most bytes of an oversized body read before answering.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, drain_bytes: int = 64 << 20) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.drain_bytes = max(drain_bytes, max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.drain_bytes:
            await send_error(send, self._too_large())
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            piece = message.get("body", b"")
            size += len(piece)
            if size <= self.max_bytes:
                chunks.append(piece)
            if not message.get("more_body", False) or size > self.drain_bytes:
                break
        if size > self.max_bytes:
            logger.info("rejected a body of %d+ bytes on %s", size, scope.get("path"))
            await send_error(send, self._too_large())
            return
        body = b"".join(chunks)
        if body.startswith(codecs.BOM_UTF8):
            await send_error(send, APIError(
                400, "the request body starts with a UTF-8 byte order mark; send the JSON "
                "without it", code="invalid_json"))
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body exceeds {self.max_bytes} bytes",
                        code="request_too_large")


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for the disconnect

    return replay


def _header(scope: Scope, name: bytes) -> str | None:
    found = _headers(scope, name)
    return found[0] if found else None


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [bytes(value).decode("latin-1") for key, value in scope.get("headers", ())
            if key.lower() == name]

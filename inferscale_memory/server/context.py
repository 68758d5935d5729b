"""What the request handlers share: the engine, the metrics, the served model's name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from inferscale_memory.server.auth import ANONYMOUS, USER_HEADER, Principal, resolve_user
from inferscale_memory.server.errors import APIError
from inferscale_memory.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from inferscale_memory.engine import MemoryEngine

MAX_TOKENS_LIMIT = 4096  # the server's default largest max_tokens


@dataclass
class ServerContext:
    """State of one app.

    Attributes:
        engine: The engine; the app's handlers run on its event loop.
        metrics: The app's Prometheus metrics.
        model_name: The id clients pass as ``model``.
        max_tokens_limit: The most tokens one answer may ask for (``None``: the context).
        created: Unix time the app was built (the model card's ``created``).
    """

    engine: MemoryEngine
    metrics: ServerMetrics
    model_name: str
    max_tokens_limit: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, model: str) -> None:
        """Raise a 404 unless ``model`` is the served model."""
        if model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                           f"{self.model_name!r} (GET /v1/models)", type="invalid_request_error",
                           param="model", code="model_not_found")


    def check_max_tokens(self, value: Any, param: str) -> None:
        """Raise a 400 if ``value`` exceeds the server's ``max_tokens`` limit (a value that
        is no count at all is the engine's to refuse)."""
        if isinstance(value, int) and self.max_tokens_limit is not None \
                and value > self.max_tokens_limit:
            raise APIError(400, f"{param} is {value}; this server answers with at most "
                           f"{self.max_tokens_limit} tokens", param=param, code="invalid_value")


def context(request: Request) -> ServerContext:
    """The :class:`ServerContext` of the request's app."""
    return request.app.state.context  # type: ignore[no-any-return]


def principal(request: Request) -> Principal:
    """Who sent the request (set by the authentication middleware)."""
    return getattr(request.state, "principal", ANONYMOUS)


def request_user(request: Request, explicit: str | None, *, required: bool) -> str | None:
    """The request's user (body/query, or the ``X-Memory-User`` header), authorized.

    Raises:
        APIError: 400 when ``required`` and none is named, 403 when not allowed.
    """
    found = resolve_user(principal(request), explicit, user_header(request))
    if found is None and required:
        raise APIError(400, f"name the user: user_id in the request or the {USER_HEADER} "
                       "header", param="user_id", code="missing_user")
    return found


def user_header(request: Request) -> str | None:
    """The ``X-Memory-User`` header, decoded as UTF-8 (HTTP hands bytes; "zoë" is sent as
    its UTF-8 bytes by common clients).

    Raises:
        APIError: 400 when the header is not UTF-8, or sent twice.
    """
    found = request.headers.getlist(USER_HEADER)  # Starlette decodes header bytes as Latin-1
    if len(found) > 1:  # a proxy that reads the other one would disagree
        raise APIError(400, f"the request has more than one {USER_HEADER} header; send one",
                       code="multiple_user_headers")
    raw = found[0] if found else None
    if raw is None or raw.isascii():
        return raw
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, f"the {USER_HEADER} header is not UTF-8; send it as UTF-8, or "
                       "name the user in the body (user_id; user in chats)",
                       code="invalid_user_header") from None

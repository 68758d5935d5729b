"""What the request handlers share: the engine, the metrics, the served model's name."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request

from inferscale_memory.server.auth import ANONYMOUS, USER_HEADER, Principal, resolve_tenant
from inferscale_memory.server.errors import APIError
from inferscale_memory.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from inferscale_memory.engine import MemoryEngine

T = TypeVar("T")


@dataclass
class ServerContext:
    """State of one app.

    Attributes:
        engine: The engine; the app's handlers run on its event loop.
        metrics: The app's Prometheus metrics.
        model_name: The id clients pass as ``model``.
        created: Unix time the app was built (the model card's ``created``).
    """

    engine: MemoryEngine
    metrics: ServerMetrics
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, model: str) -> None:
        """Raise a 404 unless ``model`` is the served model."""
        if model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                           f"{self.model_name!r} (GET /v1/models)", type="invalid_request_error",
                           param="model", code="model_not_found")


def context(request: Request) -> ServerContext:
    """The :class:`ServerContext` of the request's app."""
    return request.app.state.context  # type: ignore[no-any-return]


def principal(request: Request) -> Principal:
    """Who sent the request (set by the authentication middleware)."""
    return getattr(request.state, "principal", ANONYMOUS)


def tenant(request: Request, explicit: str | None, *, required: bool) -> str | None:
    """The request's tenant (body/query, or the ``X-Memory-User`` header), authorized.

    Raises:
        APIError: 400 when ``required`` and none is named, 403 when not allowed.
    """
    found = resolve_tenant(principal(request), explicit, request.headers.get(USER_HEADER))
    if found is None and required:
        raise APIError(400, f"name the user: user_id in the request or the {USER_HEADER} "
                       "header", param="user_id", code="missing_user")
    return found


async def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (a store read) in the loop's default executor."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(func, *args, **kwargs))

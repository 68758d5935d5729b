"""The FastAPI app around an existing :class:`~inferscale_memory.MemoryEngine`.

Example:
    >>> app = create_app(engine, api_keys={"sk-a": ["alice"]})      # doctest: +SKIP
    >>> handle = start_server(app, engine, port=8000)               # doctest: +SKIP

The app's handlers must run on the engine's event loop (``engine.runtime.loop``):
:func:`~inferscale_memory.server.run.start_server` runs uvicorn there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from inferscale_memory import __version__
from inferscale_memory.server import chat, memories
from inferscale_memory.server.auth import ApiKeys
from inferscale_memory.server.context import MAX_TOKENS_LIMIT, ServerContext, context
from inferscale_memory.server.errors import ErrorResponseDoc, install_handlers
from inferscale_memory.server.metrics import ServerMetrics
from inferscale_memory.server.middleware import Authentication, BodyLimit, RequestCounter
from inferscale_memory.server.schemas import Health, ModelCard, ModelList

if TYPE_CHECKING:
    from inferscale_memory.engine import MemoryEngine

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 1 << 20
DESCRIPTION = """OpenAI-compatible chat with per-user memory: each fact's KV cache is
computed once and injected at answer time. The user of a request is `user` (chat),
`user_id` (memories) or the `X-Memory-User` header; send `Authorization: Bearer <key>`
when the server has API keys."""


def create_app(engine: MemoryEngine, api_keys: ApiKeys | Mapping[str, Any] | None = None, *,
               model_name: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               metrics_refresh_s: float = 15.0,
               max_tokens_limit: int | None = MAX_TOKENS_LIMIT) -> FastAPI:
    """Build the server's app around ``engine``.

    Args:
        engine: A started engine; the app never closes it.
        api_keys: :class:`ApiKeys`, or a mapping key -> users list or ``"*"``; ``None``
            disables authentication.
        model_name: The model id clients send (default: the model folder's name).
        max_body_bytes: Larger request bodies get a 413.
        metrics_refresh_s: Shortest time between two walks of the store for ``/metrics``.
        max_tokens_limit: The largest ``max_tokens`` a chat may ask for (larger: a 400),
            so that one request cannot hold the engine for long; ``None``: only the
            model's context limits it.

    Returns:
        The FastAPI app (serve it with :func:`~inferscale_memory.server.run.start_server`).
    """
    keys = api_keys if api_keys is None or isinstance(api_keys, ApiKeys) else ApiKeys(api_keys)
    # No redirects: "/v1/memories/" (an empty fact id) must never land on another route.
    app = FastAPI(title="inferscale-memory", version=__version__, description=DESCRIPTION,
                  redirect_slashes=False)
    metrics = ServerMetrics(engine, refresh_s=metrics_refresh_s)
    if max_tokens_limit is not None and max_tokens_limit < 1:
        raise ValueError(f"max_tokens_limit must be >= 1 or None; got {max_tokens_limit}")
    app.state.context = ServerContext(engine, metrics, model_name or engine.model_name,
                                      max_tokens_limit)
    install_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # type: ignore[arg-type]
    app.add_middleware(Authentication, keys=keys)  # type: ignore[arg-type]
    app.add_middleware(RequestCounter, metrics=metrics, router=app.router)  # type: ignore[arg-type]
    app.include_router(chat.router)
    app.include_router(memories.router)
    _add_service_routes(app)
    return app


def _model_card(ctx: ServerContext) -> ModelCard:
    return ModelCard(id=ctx.model_name, created=ctx.created,
                     max_model_len=ctx.engine.runtime.max_model_len)


def _add_service_routes(app: FastAPI) -> None:
    @app.get("/v1/models", response_model=ModelList, tags=["models"],
             responses=ErrorResponseDoc)
    async def list_models(request: Request) -> ModelList:
        """The served model."""
        return ModelList(data=[_model_card(context(request))])

    @app.get("/v1/models/{model:path}", response_model=ModelCard, tags=["models"],
             responses=ErrorResponseDoc)
    async def get_model(model: str, request: Request) -> ModelCard:
        """One model (404 unless it is the served one)."""
        ctx = context(request)
        ctx.check_model(model)
        return _model_card(ctx)

    @app.get("/health", response_model=Health, tags=["service"],
             responses={503: {"model": Health}})
    async def health(request: Request) -> Any:
        """200 while the engine runs, 503 once it failed or was shut down."""
        ctx = context(request)
        ok = ctx.engine.healthy
        body = Health(status="ok" if ok else "unavailable", model=ctx.model_name)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics (text exposition format)."""
        data = await context(request).metrics.render()
        return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")

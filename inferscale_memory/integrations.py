"""Helpers for framework adapters (LangChain, LlamaIndex, Mem0, your own).

A framework object either gets a :class:`~inferscale_memory.MemoryEngine` or shares one
default engine per model in the process (:func:`default_engine`). The engine runs on a
private event loop; its async API (``achat``, ``astream_chat``, ``memory.aadd``, ...) can
be awaited from any loop, and :func:`on_engine` carries any other coroutine of the engine
across.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from inferscale_memory.engine import MemoryEngine
from inferscale_memory.errors import UnknownUserError
from inferscale_memory.results import ChatChunk, ChatResult

T = TypeVar("T")
logger = logging.getLogger(__name__)
_default_engines: dict[str | None, MemoryEngine] = {}
_lock = threading.Lock()


def default_engine(model: str | None = None) -> MemoryEngine:
    """The process-wide engine for ``model`` (``None``: the embedded default), started on
    first use and closed at exit."""
    with _lock:
        if model not in _default_engines:
            logger.warning(
                "no engine given: starting this process's default engine (model %s, the "
                "default fact store); this takes minutes and GBs of memory. Pass "
                "engine=MemoryEngine(...) to choose the model, store and cache size.",
                model or "embedded default")
            engine = MemoryEngine(model)
            atexit.register(engine.close)
            _default_engines[model] = engine
        return _default_engines[model]


async def on_engine(engine: MemoryEngine, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the engine's loop from whatever loop the caller runs on."""
    return await engine.runtime.call(coro)


# -- answers for users who may have no memory yet ------------------------------------------
# Frameworks create a chat model for a user before the user has any fact; such a user is
# answered without memory instead of failing (``request``: keyword arguments of
# :meth:`MemoryEngine.achat`, ``messages`` included).


async def achat_or_plain(engine: MemoryEngine, request: dict[str, Any],
                         timeout: float | None = None) -> ChatResult:
    """:meth:`MemoryEngine.achat` from any loop, within ``timeout`` seconds; a user without
    facts yet gets none."""

    async def answer(options: dict[str, Any]) -> ChatResult:
        try:
            return await asyncio.wait_for(engine.achat(**options), timeout)
        except TimeoutError:
            raise TimeoutError(f"no answer within {timeout} s (the model's timeout); the "
                               "request was cancelled") from None

    try:
        return await on_engine(engine, answer(request))
    except UnknownUserError:
        return await on_engine(engine, answer(_without_memory(request)))


def stream_or_plain(engine: MemoryEngine, request: dict[str, Any]) -> Iterator[ChatChunk]:
    """:meth:`MemoryEngine.stream_chat`; a user without facts yet (known before the first
    chunk) gets none."""
    started = False
    try:
        for piece in engine.stream_chat(**request):
            started = True
            yield piece
    except UnknownUserError:
        if started:
            raise
        yield from engine.stream_chat(**_without_memory(request))


async def astream_or_plain(engine: MemoryEngine,
                           request: dict[str, Any]) -> AsyncIterator[ChatChunk]:
    """:func:`stream_or_plain` for async callers on any loop."""
    started = False
    try:
        async for piece in engine.astream_chat(**request):
            started = True
            yield piece
    except UnknownUserError:
        if started:
            raise
        async for piece in engine.astream_chat(**_without_memory(request)):
            yield piece


def _without_memory(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` answered without memory, still as its user's (prefix-cache isolation)."""
    return {**request, "user_id": None, "tenant": request.get("user_id")}

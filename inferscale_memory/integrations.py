"""Helpers for framework adapters (LangChain, LlamaIndex, Mem0, your own).

A framework object either gets a :class:`~inferscale_memory.MemoryEngine` or shares one
default engine per model in the process (:func:`default_engine`). The engine runs on a
private event loop; its async API (``achat``, ``astream_chat``, ``memory.aadd``, ...) can
be awaited from any loop, and :func:`on_engine` carries any other coroutine of the engine
across. A user with no facts yet needs nothing here: the engine answers them without
memory (``metrics.memory_used`` is ``False``). An answer's text reaches the framework as
a user should see it: :func:`shown` (a whole answer), :func:`shown_stream` and
:func:`ashown_stream` (a stream) take out the tags of our tool prompt that a model may echo
(:mod:`~inferscale_memory.markup`). An adapter that finds capture contexts in its
framework's own store orders them as the engine does: :func:`in_context_order`.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from inferscale_memory.engine import MemoryEngine
from inferscale_memory.fields import in_context_order
from inferscale_memory.markup import ashown_stream, shown, shown_stream
from inferscale_memory.results import ChatResult
from inferscale_memory.tools import TOOL_CHOICES

T = TypeVar("T")
# The chat keywords of tools and structured output, in OpenAI's shapes (checked by the
# engine): the adapters pass them through.
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
__all__ = ["TOOL_CHOICES", "TOOL_KEYS", "ashown_stream", "call_arguments", "default_engine",
           "in_context_order", "on_engine", "shown", "shown_stream"]
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


async def achat_within(engine: MemoryEngine, request: dict[str, Any],
                      timeout: float | None) -> ChatResult:
    """:meth:`MemoryEngine.achat` from any loop (``request``: its keyword arguments,
    ``messages`` included), cancelled after ``timeout`` seconds (vLLM aborts it)."""

    async def answer() -> ChatResult:
        try:
            return await asyncio.wait_for(engine.achat(**request), timeout)
        except TimeoutError:
            raise TimeoutError(f"no answer within {timeout} s (the model's timeout); the "
                               "request was cancelled") from None

    return await on_engine(engine, answer())


def call_arguments(text: str) -> dict[str, Any] | None:
    """A tool call's arguments (JSON text) as a dict; ``None`` if they are no JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

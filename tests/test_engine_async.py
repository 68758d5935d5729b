"""The engine's async contract: its async API works from any event loop, and a closed
engine refuses every call at once with a typed error, losing nothing."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from test_engine import ask

from inferscale_memory import EngineClosedError, MemoryConfig, MemoryEngine, MemoryStore
from inferscale_memory.embeddings import default_embedder

pytestmark = pytest.mark.engine
DEADLINE_S = 10.0  # a few-token answer takes well under a second here
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uuid_named(folder: Path) -> set[str]:
    """The names vLLM gives its ZMQ sockets (``<VLLM_RPC_BASE_PATH>/<uuid4>``)."""
    return {entry.name for entry in folder.iterdir() if UUID.fullmatch(entry.name)}


def on_idle_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coro`` on a new event loop of this thread that nothing else wakes up (an
    application's own loop: FastAPI, Jupyter, an async agent), with a deadline."""
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def test_async_api_answers_on_a_foreign_idle_loop(engine: MemoryEngine) -> None:
    user = "foreign-loop"
    added = on_idle_loop(engine.memory.aadd("Zoe keeps bees in Bristol.", user_id=user))
    found = on_idle_loop(engine.memory.asearch("Who keeps bees?", user_id=user, k=1))
    assert [s.fact.id for s in found] == [added.id]
    question = ask("Where does Zoe keep her bees?")
    reply = on_idle_loop(engine.achat(question, user_id=user, k=1, max_tokens=6))
    assert reply.metrics.fact_ids == [added.id] and reply.metrics.injected_tokens > 0

    async def stream() -> list[Any]:
        return [chunk async for chunk in engine.astream_chat(question, user_id=user, k=1,
                                                             max_tokens=6)]

    chunks = on_idle_loop(stream())
    assert chunks[-1].result is not None
    assert chunks[-1].result.token_ids == reply.token_ids
    assert "".join(chunk.text for chunk in chunks) == reply.text
    on_idle_loop(engine.memory.adelete(added.id, user_id=user))
    assert engine.memory.list(user_id=user) == []


def framework_calls(engine: MemoryEngine) -> dict[str, Callable[[], Any]]:
    """The LangChain adapter's sync calls on ``engine`` (retrieval first, so a closed
    engine is first met through its store), where the adapter is installed."""
    if importlib.util.find_spec("langchain_inferscale") is None:
        return {}
    from langchain_inferscale import ChatInferScale, InferScaleRetriever

    model = ChatInferScale(engine=engine, user_id="closed", max_tokens=4)
    retriever = InferScaleRetriever(engine=engine, user_id="closed")
    return {"ChatInferScale.invoke": lambda: model.invoke("When does Ada sail?"),
            "ChatInferScale.stream": lambda: list(model.stream("When does Ada sail?")),
            "InferScaleRetriever.invoke": lambda: retriever.invoke("When does Ada sail?")}


@pytest.mark.timeout(300)  # a call that waited on the closed engine would hang here
def test_a_closed_engine_refuses_every_call_at_once(tmp_path: Path, tiny_model: Path) -> None:
    path = tmp_path / "memory.sqlite"
    temp = Path(tempfile.gettempdir())
    litter = uuid_named(temp)
    # The tiny random-weight model: only the closed engine's refusals are under test.
    with MemoryEngine(str(tiny_model), store_path=str(path), kv_cache_gb=1,
                      max_model_len=1024, enforce_eager=True) as engine:
        sockets = engine.runtime.socket_folder
        assert sockets is not None and uuid_named(sockets)  # vLLM's sockets are there
        fact = engine.memory.add("Ada sails on Sundays.", user_id="closed")
    # They went with the engine's own folder: none is left in the temp folder (issue 31,
    # item 10: 7 per start were).
    assert not sockets.exists()
    assert uuid_named(temp) - litter == set()
    question = ask("When does Ada sail?")
    calls = {
        "chat": lambda: engine.chat(question, user_id="closed", max_tokens=4),
        "stream_chat": lambda: list(engine.stream_chat(question, user_id="closed")),
        "add": lambda: engine.memory.add("Ada sails far.", user_id="closed"),
        "delete": lambda: engine.memory.delete(fact.id, user_id="closed"),
        "achat": lambda: on_idle_loop(engine.achat(question, user_id="closed")),
        "aadd": lambda: on_idle_loop(engine.memory.aadd("Ada sails far.", user_id="closed")),
        # Reads too: the store closed with the engine, but the fix is a new engine.
        "search": lambda: engine.memory.search("sail", user_id="closed"),
        "list": lambda: engine.memory.list(user_id="closed"),
        "get": lambda: engine.memory.get(fact.id, user_id="closed"),
        "history": lambda: engine.memory.history(fact.id, user_id="closed"),
        "warm": lambda: engine.warm("closed"),
        **framework_calls(engine),
    }
    for name, call in calls.items():
        # Refused by the closed check itself: a call that reached the stopped engine or the
        # closed store would fail otherwise (EngineDeadError, StoreError) or hang.
        try:
            call()
        except EngineClosedError as exc:
            assert "closed" in str(exc), name
        else:
            pytest.fail(f"{name} on a closed engine was not refused")
    engine.close()  # idempotent
    # Nothing was lost or half-done: the store holds the one fact, unchanged.
    config = MemoryConfig.load(store_path=str(path))
    with MemoryStore.from_config(config, default_embedder(config.embedder)) as store:
        assert [(f.id, f.text) for f in store.list(user_id="closed")] == [(fact.id, fact.text)]

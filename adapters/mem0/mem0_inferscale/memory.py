"""Mem0 on an inferscale-memory engine: configuration, attaching, and answering."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

from mem0 import AsyncMemory, Memory
from mem0.configs.base import mem0_dir

from inferscale_memory import ChatResult, Fact, MemoryEngine, ScoredFact
from inferscale_memory.integrations import shown
from mem0_inferscale import extras
from mem0_inferscale.llm import llm_config
from mem0_inferscale.vector_store import InferScaleVectorStore, user_of

EXTRACTION_MAX_TOKENS = 512
M = TypeVar("M", Memory, AsyncMemory)


def mem0_config(engine: MemoryEngine, *, vector_store: dict[str, Any] | None = None,
                history_db_path: str | None = None, folder: str | None = None,
                **extra: Any) -> dict[str, Any]:
    """A Mem0 config that runs fully offline on ``engine``.

    Fact extraction runs on the engine without memory (:class:`~mem0_inferscale.InferScaleLLM`,
    the ``"inferscale"`` LLM provider: guided JSON, and a compact extraction prompt where
    Mem0's does not fit the model's context); embeddings use Mem0's ``"langchain"``
    embedder with :class:`~langchain_inferscale.InferScaleEmbeddings` (the engine's
    all-MiniLM-L6-v2). The vector store defaults to Mem0's qdrant in local mode under
    ``folder``. An ``llm`` section of your own (in ``extra``) is used as given.

    Args:
        engine: The engine for extraction (and, after :func:`attach`, the facts' KV).
        vector_store: Mem0's ``vector_store`` section; its dimension must be 384.
        history_db_path: Mem0's history database.
        folder: Where the defaults live (default ``$MEM0_DIR/inferscale``).
        **extra: Other Mem0 config keys (``custom_instructions``, ``reranker``, ``llm``...).
    """
    from langchain_inferscale import InferScaleEmbeddings

    folder = folder or os.path.join(mem0_dir, "inferscale")
    return {
        "llm": extra.pop("llm", None) or llm_config(engine, max_tokens=EXTRACTION_MAX_TOKENS,
                                                    temperature=0.0),
        "embedder": {"provider": "langchain", "config": {"model": InferScaleEmbeddings()}},
        "vector_store": vector_store or {"provider": "qdrant", "config": {
            "collection_name": "mem0", "embedding_model_dims": 384,
            "path": os.path.join(folder, "qdrant"), "on_disk": True}},
        "history_db_path": history_db_path or os.path.join(folder, "history.db"),
        **extra,
    }


def attach(memory: M, engine: MemoryEngine) -> M:
    """Have every fact ``memory`` (a ``Memory`` or ``AsyncMemory``) stores keep its KV on
    ``engine`` (from now on).

    Wraps ``memory.vector_store`` in an :class:`InferScaleVectorStore`; idempotent.
    Facts stored before attaching get their KV on their first answer (recomputed from
    text, then recaptured) or by :func:`warm`. Mem0's optional extras that are not
    installed (spaCy, fastembed) are off without Mem0's warnings (:mod:`~mem0_inferscale.extras`).
    """
    if not isinstance(memory.vector_store, InferScaleVectorStore):
        extras.skip_missing(memory.vector_store)
        memory.vector_store = InferScaleVectorStore(memory.vector_store, engine)
    return memory


def from_engine(engine: MemoryEngine, **config: Any) -> Memory:
    """A Mem0 ``Memory`` on ``engine``: :func:`mem0_config` plus :func:`attach`.

    Example:
        >>> memory = from_engine(engine)                              # doctest: +SKIP
        >>> memory.add([{"role": "user", "content": "I moved to Berlin."}],
        ...            user_id="caroline")                         # Mem0 extracts the facts
        >>> answer(memory, "Where do I live?", user_id="caroline").text
    """
    return attach(Memory.from_config(mem0_config(engine, **config)), engine)


def answer(memory: Memory, query: str, *, user_id: str | None = None,
           agent_id: str | None = None, run_id: str | None = None, k: int = 10,
           mode: str = "kv", messages: Sequence[dict[str, Any]] = (),
           filters: dict[str, Any] | None = None, **options: Any) -> ChatResult:
    """Answer ``query`` with Mem0's search results for a scope injected as KV.

    The scope is Mem0's: any of ``user_id``, ``agent_id`` and ``run_id``, as keywords (as
    in Mem0's ``add``) or in ``filters`` (as in its ``search``), alone or combined.

    Example:
        >>> answer(memory, "What do I like?", user_id="caroline", agent_id="travel")
        ...                                                           # doctest: +SKIP

    Args:
        memory: A Mem0 ``Memory`` after :func:`attach` (for an ``AsyncMemory``, await
            :func:`aanswer`).
        query: The user's question (also Mem0's search query).
        user_id: Whose memories to search and inject.
        agent_id: The agent's memories (alone, or with ``user_id`` / ``run_id``).
        run_id: The run's (session's) memories.
        k: Memories to retrieve (Mem0's ``top_k``).
        mode: ``"kv"`` injects the facts' KV, ``"text"`` prefills their text (A/B).
        messages: Earlier turns, OpenAI-style, before the question.
        filters: Mem0's search filters (scope ids, metadata, operators).
        **options: ``max_tokens``, ``temperature``, ``stop``, ``logprobs``, ``seed``.

    Returns:
        The engine's :class:`~inferscale_memory.ChatResult` (text and metrics).

    Raises:
        ValueError: No scope id, or one given twice with different values.
        TypeError: ``memory`` is an ``AsyncMemory``, or not attached to an engine.
    """
    if isinstance(memory, AsyncMemory):
        raise TypeError("answer() got a mem0 AsyncMemory: "
                        "use `await mem0_inferscale.aanswer(...)`")
    store = _store_of(memory, "answer")
    scope = _scope(filters, user_id=user_id, agent_id=agent_id, run_id=run_id)
    user = user_of(scope)
    found = memory.search(query, top_k=k, filters=scope)
    return shown(store.engine.answer([*messages, {"role": "user", "content": query}],
                                     _facts(found, user), user_id=user, mode=mode, **options))


async def aanswer(memory: AsyncMemory, query: str, *, user_id: str | None = None,
                  agent_id: str | None = None, run_id: str | None = None, k: int = 10,
                  mode: str = "kv", messages: Sequence[dict[str, Any]] = (),
                  filters: dict[str, Any] | None = None, **options: Any) -> ChatResult:
    """:func:`answer` for Mem0's ``AsyncMemory``, awaitable from any event loop.

    Example:
        >>> memory = attach(AsyncMemory.from_config(mem0_config(engine)), engine)
        >>> await aanswer(memory, "Where do I live?", user_id="caroline")  # doctest: +SKIP
    """
    if not isinstance(memory, AsyncMemory):
        raise TypeError("aanswer() needs a mem0 AsyncMemory; for a Memory, call answer()")
    store = _store_of(memory, "aanswer")
    scope = _scope(filters, user_id=user_id, agent_id=agent_id, run_id=run_id)
    user = user_of(scope)
    found = await memory.search(query, top_k=k, filters=scope)
    return shown(await store.engine.achat([*messages, {"role": "user", "content": query}],
                                          facts=_facts(found, user), user_id=user,
                                          mode=mode, **options))


def warm(memory: Memory | AsyncMemory, *, user_id: str | None = None,
         agent_id: str | None = None, run_id: str | None = None,
         filters: dict[str, Any] | None = None) -> int:
    """Capture the KV of all Mem0 memories of a scope now (as :func:`answer` takes it);
    returns how many. Blocks (also for an ``AsyncMemory``)."""
    store = _store_of(memory, "warm")
    scope = _scope(filters, user_id=user_id, agent_id=agent_id, run_id=run_id)
    user_of(scope)  # a scope id is required, as for answer
    rows = store.inner.list(filters=scope, top_k=100_000)
    rows = rows[0] if rows and isinstance(rows[0], list | tuple) else rows
    rows = [r for r in rows if r.payload and r.payload.get("data")]
    # Embeddings only to find each fact's capture context among its neighbours.
    vectors = [memory.embedding_model.embed(r.payload["data"], "add")
               if store.engine.config.capture_context else None for r in rows]
    store.capture([(str(r.id), r.payload, v) for r, v in zip(rows, vectors, strict=True)])
    return len(rows)


def _store_of(memory: Memory | AsyncMemory, caller: str) -> InferScaleVectorStore:
    store = memory.vector_store
    if not isinstance(store, InferScaleVectorStore):
        raise TypeError(f"{caller}() needs a Memory on an engine: use from_engine() or attach()")
    return store


def _scope(filters: dict[str, Any] | None, **ids: str | None) -> dict[str, Any]:
    """Mem0 search filters: ``filters`` plus the scope ids given as keywords."""
    scope = dict(filters or {})
    for name, value in ids.items():
        if value is None:
            continue
        if scope.get(name) is not None and scope[name] != value:
            raise ValueError(f"{name} given twice: {value!r} and filters' {scope[name]!r}")
        scope[name] = value
    return scope


def _facts(found: dict[str, Any], user: str) -> list[ScoredFact]:
    """Mem0's search results as the engine's facts of ``user`` (where their KV is)."""
    return [ScoredFact(Fact(hit["id"], user, hit["memory"], {}, 0.0, 0.0),
                       float(hit.get("score") or 0.0)) for hit in found["results"]]

"""InferScaleVectorStore: Mem0's vector store, with every stored fact's KV on the engine.

It wraps the store Mem0 built from its own configuration (qdrant, faiss, ...) and passes
every call through; writes are mirrored to the engine: an insert captures the facts' KV,
an update whose text changed recaptures it, a delete (and ``reset``) evicts it. The facts
stay in Mem0; the engine keys their KV by Mem0's memory id, under each Mem0 scope id the
memory carries (:func:`users_of`), so a search by any of its scopes can inject it.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from mem0.vector_stores.base import VectorStoreBase

from inferscale_memory import Fact, MemoryEngine
from inferscale_memory.integrations import in_context_order

RESET_BATCH = 1000
SCOPES = ("user_id", "agent_id", "run_id")  # Mem0's scope ids, in the order user_of picks
PREFIXES = {"user_id": "", "agent_id": "agent:", "run_id": "run:"}
# Engines a Mem0 memory was attached to: their chat models warn that Mem0's facts are not
# in the engine's store (langchain_inferscale.injection).
_engines: weakref.WeakSet[MemoryEngine] = weakref.WeakSet()


def attached(engine: MemoryEngine) -> bool:
    """Whether a Mem0 memory was attached to ``engine`` in this process: its facts are
    then in Mem0's store, and ``engine.memory`` and ``ChatInferScale`` do not see them."""
    return engine in _engines


def scope_ids(scope: Mapping[str, Any]) -> dict[str, str]:
    """The concrete Mem0 scope ids of a payload or of search filters (as Mem0 trims them;
    a ``"*"`` wildcard scopes nothing)."""
    found = {name: str(scope[name]).strip() for name in SCOPES if scope.get(name) is not None}
    return {name: value for name, value in found.items() if value and value != "*"}


def users_of(payload: Mapping[str, Any]) -> list[str]:
    """The engine users that keep a Mem0 memory's KV: one per scope id it carries.

    A search scoped by any of these ids, alone or combined, answers as one of them
    (:func:`user_of`), so every hit of any search has its KV under the search's user.
    """
    ids = scope_ids(payload)
    if not ids:
        raise ValueError("a Mem0 memory needs a user_id, agent_id or run_id")
    return [PREFIXES[name] + value for name, value in ids.items()]


def user_of(scope: Mapping[str, Any]) -> str:
    """The engine user that answers a Mem0 search scoped by ``scope`` (its filters): the
    user_id, else ``agent:<agent_id>``, else ``run:<run_id>``."""
    ids = scope_ids(scope)
    if not ids:
        raise ValueError("answering needs a user_id, agent_id or run_id (a keyword or in "
                         "filters), as Mem0's search does")
    name = next(iter(ids))
    return PREFIXES[name] + ids[name]


def facts_of(memory_id: Any, payload: Mapping[str, Any]) -> list[Fact]:
    """The engine's view of a Mem0 memory: its text under Mem0's id, once per user."""
    return [Fact(str(memory_id), user, payload["data"], {}, 0.0, 0.0)
            for user in users_of(payload)]


class InferScaleVectorStore(VectorStoreBase):
    """A Mem0 vector store that mirrors writes to an inferscale-memory engine.

    Args:
        inner: The vector store Mem0 built (``memory.vector_store``).
        engine: The engine that keeps the facts' KV.
    """

    def __init__(self, inner: VectorStoreBase, engine: MemoryEngine) -> None:
        self.inner = inner
        self.engine = engine
        _engines.add(engine)

    def __getattr__(self, name: str) -> Any:
        # Provider attributes Mem0 reads (client, collection_name, ...) are the inner store's.
        return getattr(self.inner, name)

    # -- writes, mirrored -----------------------------------------------------------------

    def insert(self, vectors: list, payloads: list | None = None, ids: list | None = None) -> Any:
        result = self.inner.insert(vectors=vectors, payloads=payloads, ids=ids)
        if payloads and ids:
            self.capture([(str(i), p, v) for i, p, v in zip(ids, payloads, vectors, strict=True)
                          if p.get("data")])
        return result

    def update(self, vector_id: Any, vector: Any = None, payload: dict | None = None) -> Any:
        old_text = self._text(vector_id) if payload else None
        result = self.inner.update(vector_id=vector_id, vector=vector, payload=payload)
        if payload and payload.get("data") and payload["data"] != old_text:
            self.capture([(str(vector_id), payload, vector)])
        return result

    def delete(self, vector_id: Any) -> Any:
        found = self.inner.get(vector_id=vector_id)
        result = self.inner.delete(vector_id=vector_id)
        if found is not None and found.payload:
            self._evict(facts_of(vector_id, found.payload))
        return result

    def delete_col(self) -> Any:
        self._evict_everything()
        return self.inner.delete_col()

    def reset(self) -> Any:
        self._evict_everything()
        return self.inner.reset()

    # -- reads, passed through ------------------------------------------------------------

    def create_col(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.create_col(*args, **kwargs)

    def search(self, query: str, vectors: Any, top_k: int = 5, filters: dict | None = None) -> Any:
        return self.inner.search(query=query, vectors=vectors, top_k=top_k, filters=filters)

    def keyword_search(self, query: str, top_k: int = 5, filters: dict | None = None) -> Any:
        return self.inner.keyword_search(query=query, top_k=top_k, filters=filters)

    def search_batch(self, queries: list, vectors_list: list, top_k: int = 1,
                     filters: dict | None = None) -> Any:
        return self.inner.search_batch(queries=queries, vectors_list=vectors_list,
                                       top_k=top_k, filters=filters)

    def get(self, vector_id: Any) -> Any:
        return self.inner.get(vector_id=vector_id)

    def list(self, filters: dict | None = None, top_k: int | None = None) -> Any:
        return self.inner.list(filters=filters, top_k=top_k)

    def list_cols(self) -> Any:
        return self.inner.list_cols()

    def col_info(self) -> Any:
        return self.inner.col_info()

    # -- engine ---------------------------------------------------------------------------

    def capture(self, stored: list[tuple[str, dict[str, Any], Any]]) -> None:
        """Capture the KV of Mem0 memories given as (memory id, payload, embedding or None),
        under each of their users (:func:`users_of`).

        With the engine's ``capture_context`` = n > 0, each memory is captured after its n
        nearest memories of the same scope in this store (Mem0's users are not in the
        engine's own store), in the order they were created, or least similar first with
        ``capture_context_order="similarity"`` (as the engine's own store orders them).
        """
        contexts = {memory_id: self._neighbours(memory_id, payload, vector)
                    for memory_id, payload, vector in stored}
        facts = [fact for memory_id, payload, _ in stored for fact in facts_of(memory_id, payload)]
        for user_id, group in _by_user(facts).items():
            self.engine.arun(self.engine.fact_kv.capture(user_id, group, contexts))

    def _neighbours(self, memory_id: str, payload: dict[str, Any], vector: Any
                    ) -> tuple[str, ...]:
        count = self.engine.config.capture_context
        if count == 0 or vector is None:
            return ()
        hits = self.inner.search(query=payload["data"], vectors=vector, top_k=count + 1,
                                 filters=scope_ids(payload))
        near = [hit.payload for hit in hits if str(hit.id) != memory_id and hit.payload
                and hit.payload.get("data")][:count]  # best first
        ordered = in_context_order(near, self.engine.config.capture_context_order,
                                   added=lambda p: str(p.get("created_at")))
        return tuple(p["data"] for p in ordered)

    def _evict(self, facts: Iterable[Fact]) -> None:
        for user_id, group in _by_user(facts).items():
            self.engine.arun(self.engine.fact_kv.evict_deleted(user_id, [f.id for f in group]))

    def _text(self, vector_id: Any) -> str | None:
        found = self.inner.get(vector_id=vector_id)
        return (found.payload or {}).get("data") if found is not None else None

    def _evict_everything(self) -> None:
        rows = self.inner.list(top_k=RESET_BATCH * 1000)
        rows = rows[0] if rows and isinstance(rows[0], list | tuple) else rows
        self._evict(fact for row in rows if row.payload and row.payload.get("data")
                    for fact in facts_of(row.id, row.payload))


def _by_user(facts: Iterable[Fact]) -> dict[str, list[Fact]]:
    groups: dict[str, list[Fact]] = defaultdict(list)
    for fact in facts:
        groups[fact.user_id].append(fact)
    return groups

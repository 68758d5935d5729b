"""InferScaleVectorStore: Mem0's vector store, with every stored fact's KV on the engine.

It wraps the store Mem0 built from its own configuration (qdrant, faiss, ...) and passes
every call through; writes are mirrored to the engine: an insert captures the facts' KV,
an update whose text changed recaptures it, a delete (and ``reset``) evicts it. The facts
stay in Mem0; the engine keys their KV by Mem0's memory id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from mem0.vector_stores.base import VectorStoreBase

from inferscale_memory import Fact, MemoryEngine

RESET_BATCH = 1000
SCOPES = ("user_id", "agent_id", "run_id")


def tenant_of(payload: dict[str, Any]) -> str:
    """The engine user whose KV holds a Mem0 memory: its user_id, else its agent or run."""
    if payload.get("user_id"):
        return str(payload["user_id"])
    if payload.get("agent_id"):
        return f"agent:{payload['agent_id']}"
    if payload.get("run_id"):
        return f"run:{payload['run_id']}"
    raise ValueError("a Mem0 memory needs a user_id, agent_id or run_id")


def fact_of(memory_id: str, payload: dict[str, Any]) -> Fact:
    """The engine's view of a Mem0 memory (its text under Mem0's id)."""
    return Fact(str(memory_id), tenant_of(payload), payload["data"], {}, 0.0, 0.0)


class InferScaleVectorStore(VectorStoreBase):
    """A Mem0 vector store that mirrors writes to an inferscale-memory engine.

    Args:
        inner: The vector store Mem0 built (``memory.vector_store``).
        engine: The engine that keeps the facts' KV.
    """

    def __init__(self, inner: VectorStoreBase, engine: MemoryEngine) -> None:
        self.inner = inner
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        # Provider attributes Mem0 reads (client, collection_name, ...) are the inner store's.
        return getattr(self.inner, name)

    # -- writes, mirrored -----------------------------------------------------------------

    def insert(self, vectors: list, payloads: list | None = None, ids: list | None = None) -> Any:
        result = self.inner.insert(vectors=vectors, payloads=payloads, ids=ids)
        if payloads and ids:
            self.capture([(fact_of(i, p), p, v) for i, p, v
                          in zip(ids, payloads, vectors, strict=True) if p.get("data")])
        return result

    def update(self, vector_id: Any, vector: Any = None, payload: dict | None = None) -> Any:
        old_text = self._text(vector_id) if payload else None
        result = self.inner.update(vector_id=vector_id, vector=vector, payload=payload)
        if payload and payload.get("data") and payload["data"] != old_text:
            self.capture([(fact_of(vector_id, payload), payload, vector)])
        return result

    def delete(self, vector_id: Any) -> Any:
        found = self.inner.get(vector_id=vector_id)
        result = self.inner.delete(vector_id=vector_id)
        if found is not None and found.payload:
            self._evict([fact_of(vector_id, found.payload)])
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

    def capture(self, stored: list[tuple[Fact, dict[str, Any], Any]]) -> None:
        """Capture the KV of Mem0 memories given as (fact, payload, embedding or None).

        With the engine's ``capture_context`` = n > 0, each fact is captured after its n
        nearest memories of the same scope in this store (Mem0's users are not in the
        engine's own store), in the order they were created.
        """
        contexts = {fact.id: self._neighbours(fact, payload, vector)
                    for fact, payload, vector in stored}
        for user_id, group in _by_tenant(fact for fact, _, _ in stored).items():
            self.engine.arun(self.engine.memory.capture(user_id, group, contexts))

    def _neighbours(self, fact: Fact, payload: dict[str, Any], vector: Any) -> tuple[str, ...]:
        count = self.engine.config.capture_context
        if count == 0 or vector is None:
            return ()
        scope = {key: payload[key] for key in SCOPES if payload.get(key)}
        hits = self.inner.search(query=fact.text, vectors=vector, top_k=count + 1,
                                 filters=scope)
        near = [hit.payload for hit in hits if str(hit.id) != fact.id and hit.payload
                and hit.payload.get("data")][:count]
        return tuple(p["data"] for p in sorted(near, key=lambda p: str(p.get("created_at"))))

    def _evict(self, facts: Iterable[Fact]) -> None:
        for user_id, group in _by_tenant(facts).items():
            self.engine.arun(self.engine.memory.evict(user_id, [f.id for f in group]))

    def _text(self, vector_id: Any) -> str | None:
        found = self.inner.get(vector_id=vector_id)
        return (found.payload or {}).get("data") if found is not None else None

    def _evict_everything(self) -> None:
        rows = self.inner.list(top_k=RESET_BATCH * 1000)
        rows = rows[0] if rows and isinstance(rows[0], list | tuple) else rows
        self._evict(fact_of(row.id, row.payload) for row in rows if row.payload
                    and row.payload.get("data"))


def _by_tenant(facts: Iterable[Fact]) -> dict[str, list[Fact]]:
    groups: dict[str, list[Fact]] = defaultdict(list)
    for fact in facts:
        groups[fact.user_id].append(fact)
    return groups

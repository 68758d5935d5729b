"""InferScaleRetriever: a user's facts as LangChain documents, for chains that want text."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, ensure_config
from pydantic import ConfigDict, Field

from inferscale_memory import ScoredFact, UnknownUserError
from inferscale_memory.integrations import default_engine


class InferScaleRetriever(BaseRetriever):
    """Retrieve a user's facts from an inferscale-memory engine as documents.

    The facts are the ones :class:`~langchain_inferscale.ChatInferScale` injects as KV;
    use the retriever where a chain needs their text (citations, a reranker, another LLM).
    Each document's ``metadata["inferscale_fact_id"]`` is its fact's id. A
    ``ChatInferScale`` that answers a prompt holding a fact's text does not inject that
    fact again (``response_metadata["memory"]["skipped_in_prompt"]``).

    Instantiate:
        .. code-block:: python

            from langchain_inferscale import InferScaleRetriever

            retriever = InferScaleRetriever(engine=engine, user_id="caroline", k=5)

    Invoke:
        .. code-block:: python

            docs = retriever.invoke("Where does Caroline live?")
            docs[0].page_content, docs[0].metadata["score"]

            # another user for one call
            retriever.invoke("...", config={"configurable": {"user_id": "bob"}})
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(default=None, exclude=True)
    """The :class:`~inferscale_memory.MemoryEngine`; ``None`` shares a default engine."""
    user_id: str | None = None
    """Whose facts to search; a per-call ``configurable["user_id"]`` takes precedence."""
    k: int = 4
    """Facts returned per query."""

    def invoke(self, input: str, config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        return super().invoke(input, config, **{**_configured(config), **kwargs})

    async def ainvoke(self, input: str, config: RunnableConfig | None = None,
                      **kwargs: Any) -> list[Document]:
        return await super().ainvoke(input, config, **{**_configured(config), **kwargs})

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        user_id = kwargs.get("user_id", self.user_id)
        if user_id is None:
            raise ValueError("InferScaleRetriever needs a user_id (constructor or "
                             "config={'configurable': {'user_id': ...}})")
        engine = self.engine if self.engine is not None else default_engine()
        try:
            hits = engine.memory.search(query, user_id=user_id, k=kwargs.get("k", self.k))
        except UnknownUserError:
            return []
        return [_document(hit) for hit in hits]

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        # The store is thread-safe; the embedding runs in a worker thread.
        return await asyncio.to_thread(self._get_relevant_documents, query,
                                       run_manager=run_manager.get_sync(), **kwargs)


def _configured(config: RunnableConfig | None) -> dict[str, Any]:
    configurable = ensure_config(config).get("configurable", {})
    return {key: configurable[key] for key in ("user_id", "k") if key in configurable}


def _document(hit: ScoredFact) -> Document:
    fact = hit.fact
    # inferscale_fact_id marks the document as one of the facts ChatInferScale injects.
    metadata = {**fact.metadata, "fact_id": fact.id, "inferscale_fact_id": fact.id,
                "user_id": fact.user_id,
                "score": hit.score, "created_at": fact.created_at,
                "updated_at": fact.updated_at}
    return Document(page_content=fact.text, metadata=metadata, id=fact.id)


__all__ = ["InferScaleRetriever"]

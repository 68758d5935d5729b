"""InferScaleEmbedding: the engine's fact embedder as a LlamaIndex embedding model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field

from inferscale_memory import MemoryEngine
from inferscale_memory.embeddings import default_embedder

DEFAULT_NAME = "all-MiniLM-L6-v2"


class InferScaleEmbedding(BaseEmbedding):
    """Sentence embeddings from the embedder the engine retrieves facts with.

    Runs on CPU in this process and never starts an engine: with ``engine=`` it loads the
    embedder that engine was configured with (the same instance, shared per process),
    without it all-MiniLM-L6-v2 (the default engine's; dimension 384) or the folder
    ``path``. Nothing is downloaded. With it, a ``VectorStoreIndex`` needs no other
    embedding provider.

    Example:
        .. code-block:: python

            from llama_index.core import Document, VectorStoreIndex
            from llama_index_inferscale import InferScaleEmbedding

            index = VectorStoreIndex.from_documents(
                [Document(text="Caroline lives in Berlin.")],
                embed_model=InferScaleEmbedding(engine=engine))
            index.as_retriever(similarity_top_k=1).retrieve("Where is Caroline?")
    """

    engine: Any = Field(default=None, exclude=True, description=(
        "The MemoryEngine whose embedder to use; None: `path`."))
    path: str | None = Field(default=None, description=(
        "A sentence-transformers BERT folder when `engine` is None; None: all-MiniLM-L6-v2."))
    embed_batch_size: int = Field(default=64, gt=0, le=2048,
                                  description="Texts per call to the embedder.")

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        if self.model_name == "unknown":
            folder = self._folder()
            self.model_name = Path(folder).name if folder else DEFAULT_NAME

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleEmbedding"

    def _folder(self) -> str | None:
        engine: MemoryEngine | None = self.engine
        return engine.config.embedder if engine is not None else self.path

    def _embed(self, texts: list[str]) -> list[Embedding]:
        return default_embedder(self._folder()).embed(texts).tolist()

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._embed([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._embed(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await asyncio.to_thread(self._embed, [query]))[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await asyncio.to_thread(self._embed, [text]))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._embed, texts)

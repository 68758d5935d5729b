"""InferScaleEmbedding: the engine's embedder in LlamaIndex, sync and async."""

from __future__ import annotations

import numpy as np
import pytest
from llama_index.core import Document, VectorStoreIndex

from inferscale_memory import MemoryEngine
from llama_index_inferscale import InferScaleEmbedding

pytestmark = pytest.mark.engine
DOCUMENTS = ["Caroline moved to Berlin in May 2023.", "Bob's dog is called Rex.",
             "The soup needs two onions and a litre of stock."]


def test_vector_store_index_retrieves_the_right_document(engine: MemoryEngine) -> None:
    index = VectorStoreIndex.from_documents([Document(text=text) for text in DOCUMENTS],
                                            embed_model=InferScaleEmbedding(engine=engine))
    hits = index.as_retriever(similarity_top_k=1).retrieve("What is the name of Bob's dog?")
    assert hits[0].node.get_content() == DOCUMENTS[1]


def test_embeds_like_the_engines_retrieval(engine: MemoryEngine) -> None:
    embed = InferScaleEmbedding(engine=engine)
    fact = engine.memory.add(DOCUMENTS[0], user_id="li-embed")
    query = "Where does Caroline live?"
    [hit] = engine.memory.search(query, user_id="li-embed", k=1)
    similarity = np.dot(embed.get_query_embedding(query), embed.get_text_embedding(fact.text))
    assert hit.fact.id == fact.id and similarity == pytest.approx(hit.score, abs=1e-4)
    assert embed.model_name == "all-MiniLM-L6-v2" and len(embed.get_query_embedding("x")) == 384


async def test_async_embeddings_equal_the_sync_ones(engine: MemoryEngine) -> None:
    embed = InferScaleEmbedding(engine=engine)
    texts = await embed.aget_text_embedding_batch(DOCUMENTS)
    assert np.allclose(texts, embed.get_text_embedding_batch(DOCUMENTS), atol=1e-5)
    assert np.allclose(await embed.aget_text_embedding(DOCUMENTS[1]), texts[1], atol=1e-5)
    query = "Where does Caroline live?"
    assert np.allclose(await embed.aget_query_embedding(query),
                       embed.get_query_embedding(query), atol=1e-5)

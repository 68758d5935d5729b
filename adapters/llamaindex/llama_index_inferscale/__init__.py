"""LlamaIndex integration of inferscale-memory: an LLM and a memory block whose facts are
injected as KV instead of pasted into the prompt, and the engine's embedder.

Example:
    >>> from llama_index_inferscale import InferScaleLLM           # doctest: +SKIP
    >>> InferScaleLLM(engine=engine, user_id="caroline").complete("Where is Caroline?")
"""

from llama_index_inferscale.embeddings import InferScaleEmbedding
from llama_index_inferscale.llms import InferScaleLLM
from llama_index_inferscale.memory import InferScaleMemoryBlock

__all__ = ["InferScaleEmbedding", "InferScaleLLM", "InferScaleMemoryBlock"]

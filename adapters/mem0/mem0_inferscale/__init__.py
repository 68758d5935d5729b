"""Mem0 on inferscale-memory: Mem0 keeps its facts, the engine keeps their KV.

Every fact Mem0 stores gets its KV captured on the engine (updates recapture, deletes
evict), and :func:`answer` (:func:`aanswer` for Mem0's ``AsyncMemory``) injects Mem0's
search results for any of its scopes (user, agent, run) as KV. Importing the package turns
Mem0's telemetry off (unless ``MEM0_TELEMETRY`` is set).

Example:
    >>> import mem0_inferscale                                     # doctest: +SKIP
    >>> memory = mem0_inferscale.from_engine(engine)              # a mem0.Memory
    >>> memory.add("I moved to Berlin in May.", user_id="caroline")  # Mem0 extracts
    >>> mem0_inferscale.answer(memory, "Where do I live?", user_id="caroline").text
"""

from mem0_inferscale import llm, telemetry
from mem0_inferscale.extraction import ExtractionError
from mem0_inferscale.llm import InferScaleLLM, InferScaleLlmConfig
from mem0_inferscale.memory import aanswer, answer, attach, from_engine, mem0_config, warm
from mem0_inferscale.vector_store import InferScaleVectorStore, attached

# This package runs without any network: Mem0's telemetry is off unless MEM0_TELEMETRY says.
telemetry.switch_off()
llm.register()  # Mem0's LlmFactory knows the "inferscale" provider

__all__ = ["ExtractionError", "InferScaleLLM", "InferScaleLlmConfig", "InferScaleVectorStore",
           "aanswer", "answer", "attach", "attached", "from_engine", "mem0_config", "warm"]

"""Mem0 on inferscale-memory: Mem0 keeps its facts, the engine keeps their KV.

Every fact Mem0 stores gets its KV captured on the engine (updates recapture, deletes
evict), and :func:`answer` injects Mem0's search results as KV.

Example:
    >>> import mem0_inferscale                                     # doctest: +SKIP
    >>> memory = mem0_inferscale.from_engine(engine)              # a mem0.Memory
    >>> memory.add("I moved to Berlin in May.", user_id="caroline", infer=False)
    >>> mem0_inferscale.answer(memory, "Where do I live?", user_id="caroline").text
"""

import os

# Mem0 reads this when it is first imported; this package runs without any network.
os.environ.setdefault("MEM0_TELEMETRY", "false")

from mem0_inferscale.memory import answer, attach, from_engine, mem0_config, warm  # noqa: E402
from mem0_inferscale.vector_store import InferScaleVectorStore  # noqa: E402

__all__ = ["InferScaleVectorStore", "answer", "attach", "from_engine", "mem0_config", "warm"]

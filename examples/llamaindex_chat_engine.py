"""A LlamaIndex chat engine whose Memory hands the user's facts to the LLM as KV.

``InferScaleMemoryBlock`` retrieves the facts each turn and ``InferScaleLLM`` has the
engine inject them: the prompt never contains their text.

Run: ``python examples/llamaindex_chat_engine.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile
from typing import Any

from facts import CAROLINE
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.memory import Memory

from inferscale_memory import MemoryEngine
from llama_index_inferscale import InferScaleLLM, InferScaleMemoryBlock


class Metrics(BaseEventHandler):
    """Keeps the engine's metrics (what it injected and computed) of every LLM call."""

    seen: list[dict[str, Any]] = []

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.seen.append(event.response.additional_kwargs["memory"])


def chat_engine(engine: MemoryEngine, user: str, mode: str) -> SimpleChatEngine:
    block = InferScaleMemoryBlock(engine=engine, user_id=user, k=10)
    memory = Memory.from_defaults(session_id=f"{user}-{mode}", memory_blocks=[block])
    return SimpleChatEngine.from_defaults(
        llm=InferScaleLLM(engine=engine, mode=mode, max_tokens=48), memory=memory)


def run(engine: MemoryEngine, user: str = "caroline") -> list[dict[str, Any]]:
    """Chat two turns by KV and by text with long-term memory; returns the metrics."""
    engine.memory.add(CAROLINE, user_id=user)
    chats = {mode: chat_engine(engine, user, mode) for mode in ("kv", "text")}
    metrics = Metrics()
    get_dispatcher().add_event_handler(metrics)
    try:
        for question in ("Where does Caroline live?", "What is her job?"):
            print(f"Q: {question}")
            for mode, chat in chats.items():
                answer = chat.chat(question).response
                m = metrics.seen[-1]
                print(f"  [{mode}] injected {m['injected_tokens']} tokens, computed "
                      f"{m['computed_tokens']}, TTFT {m['ttft_ms']:.0f} ms: {answer!r}")
    finally:
        get_dispatcher().event_handlers.remove(metrics)
    return metrics.seen


def main() -> None:
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        run(engine)


if __name__ == "__main__":
    main()

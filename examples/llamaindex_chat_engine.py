"""A LlamaIndex chat engine whose Memory hands the user's facts to the LLM as KV.

``InferScaleMemoryBlock`` retrieves the facts each turn and ``InferScaleLLM`` has the
engine inject them: the prompt never contains their text.

Run: ``python examples/llamaindex_chat_engine.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile
from typing import Any

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.memory import Memory

from inferscale_memory import MemoryEngine
from llama_index_inferscale import InferScaleLLM, InferScaleMemoryBlock

USER = "caroline"


class ShowMemory(BaseEventHandler):
    """Prints what the engine injected, at the end of every LLM call."""

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            metrics = event.response.additional_kwargs["memory"]
            print(f"   (injected {metrics['injected_tokens']} tokens of "
                  f"{len(metrics['fact_ids'])} facts, TTFT {metrics['ttft_ms']:.0f} ms)")


def main() -> None:
    """Chat two turns with long-term memory; print the answers and what was injected."""
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        engine.memory.add(["Caroline moved to Berlin in May 2023.",
                           "Caroline works as a nurse."], user_id=USER)
        block = InferScaleMemoryBlock(engine=engine, user_id=USER, k=5)
        memory = Memory.from_defaults(session_id="demo", memory_blocks=[block],
                                      token_limit=3000)
        chat = SimpleChatEngine.from_defaults(llm=InferScaleLLM(engine=engine, max_tokens=48),
                                              memory=memory)
        get_dispatcher().add_event_handler(ShowMemory())
        for question in ("Where does Caroline live?", "What is her job?"):
            print(f"Q: {question}")
            print(f"A: {chat.chat(question).response}")


if __name__ == "__main__":
    main()

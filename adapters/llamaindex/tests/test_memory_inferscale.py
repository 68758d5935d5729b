"""InferScaleMemoryBlock in LlamaIndex's Memory and chat engine: facts injected, not pasted."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.memory import Memory

from inferscale_memory import MemoryEngine
from llama_index_inferscale import InferScaleLLM, InferScaleMemoryBlock

pytestmark = pytest.mark.engine


class ChatEnds(BaseEventHandler):
    """Collects what LlamaIndex reports at the end of every LLM chat call."""

    events: list[LLMChatEndEvent] = []

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent):
            self.events.append(event)


@pytest.fixture
def chat_ends() -> Any:
    dispatcher = get_dispatcher()
    handler = ChatEnds(events=[])
    dispatcher.add_event_handler(handler)
    yield handler
    dispatcher.event_handlers.remove(handler)


def memory_for(engine: MemoryEngine, user: str, session: str) -> Memory:
    block = InferScaleMemoryBlock(engine=engine, user_id=user, k=3)
    return Memory.from_defaults(session_id=session, memory_blocks=[block], token_limit=3000)


def test_chat_engine_gets_the_facts_injected_not_pasted(engine: MemoryEngine,
                                                        chat_ends: ChatEnds) -> None:
    fact = engine.memory.add("Caroline moved to Berlin in May 2023.", user_id="li-chat")
    chat = SimpleChatEngine.from_defaults(llm=InferScaleLLM(engine=engine, max_tokens=12),
                                          memory=memory_for(engine, "li-chat", "li-chat-1"))
    reply = chat.chat("Where does Caroline live?")
    assert reply.response
    event = chat_ends.events[-1]
    assert all(fact.text not in (m.content or "") for m in event.messages)  # not pasted
    memory = event.response.additional_kwargs["memory"]
    assert memory["fact_ids"] == [fact.id] and memory["injected_tokens"] > 0
    chat.chat("And when did she move?")  # second turn: history plus the facts again
    assert chat_ends.events[-1].response.additional_kwargs["memory"]["injected_tokens"] > 0


async def test_async_chat_engine_streams_with_memory(engine: MemoryEngine,
                                                     chat_ends: ChatEnds) -> None:
    engine.memory.add("Bob's dog is called Rex.", user_id="li-achat")
    chat = SimpleChatEngine.from_defaults(llm=InferScaleLLM(engine=engine, max_tokens=8),
                                          memory=memory_for(engine, "li-achat", "li-achat-1"))
    stream = await chat.astream_chat("What is my dog called?")
    text = "".join([token async for token in stream.async_response_gen()])
    assert text


def test_deleted_facts_are_not_handed_over(engine: MemoryEngine) -> None:
    kept, dropped = engine.memory.add(["Liam lives in Oslo.", "Liam lives in Rome."],
                                      user_id="li-delete")
    engine.memory.delete(dropped.id, user_id="li-delete")
    memory = memory_for(engine, "li-delete", "li-delete-1")
    memory.put(ChatMessage(role="user", content="Where does Liam live?"))
    handed = [m.additional_kwargs["inferscale_memory"] for m in memory.get()
              if "inferscale_memory" in m.additional_kwargs]
    assert [f["id"] for f in handed[0]["facts"]] == [kept.id]


async def test_flushed_user_messages_can_become_facts(engine: MemoryEngine) -> None:
    block = InferScaleMemoryBlock(engine=engine, user_id="li-put", store_user_messages=True)
    await block.aput([ChatMessage(role="user", content="I moved to Lisbon."),
                      ChatMessage(role="assistant", content="Nice!")])
    assert [f.text for f in engine.memory.list(user_id="li-put")] == ["I moved to Lisbon."]

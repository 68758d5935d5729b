"""InferScaleMemoryBlock in LlamaIndex's Memory and chat engines: facts injected, not pasted
(read as text by any other LLM)."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import CondensePlusContextChatEngine, SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.llms import MockLLM
from llama_index.core.memory import Memory

from inferscale_memory import MemoryEngine
from llama_index_inferscale import InferScaleEmbedding, InferScaleLLM, InferScaleMemoryBlock
from llama_index_inferscale.handover import FactsMessage

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
    memory = chat_ends.events[-1].response.additional_kwargs["memory"]
    assert memory["fact_ids"] == [fact.id] and memory["injected_tokens"] > 0
    # Not pasted: the engine's prompt is the one it builds for the question alone.
    alone = engine.chat([{"role": "user", "content": "Where does Caroline live?"}],
                        user_id="li-chat", k=3, max_tokens=1)
    assert memory["prompt_tokens"] == alone.metrics.prompt_tokens
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
    handed = [m.inferscale_memory for m in memory.get() if isinstance(m, FactsMessage)]
    assert [f["id"] for f in handed[0]["facts"]] == [kept.id]


def test_memory_counts_the_facts_as_the_text_they_are(engine: MemoryEngine) -> None:
    texts = ["Mia lives in Porto.", "Mia works as a nurse at the city hospital."]
    engine.memory.add(texts, user_id="li-count")
    block = InferScaleMemoryBlock(engine=engine, user_id="li-count", k=2, priority=1)
    # 120 tokens hold the facts' text and the question; the facts' ids, timestamps and
    # metadata counted as well (about 200 tokens) made Memory drop the whole block.
    memory = Memory.from_defaults(session_id="li-count-1", memory_blocks=[block],
                                  token_limit=120)
    memory.put(ChatMessage(role="user", content="Where does Mia live and what is her job?"))
    handed = [m for m in memory.get() if isinstance(m, FactsMessage)]
    assert len(handed) == 1 and all(text in handed[0].content for text in texts)
    facts_tokens = len(memory.tokenizer_fn("\n".join(f"- {text}" for text in texts)))
    assert memory._estimate_token_count(handed[0]) <= facts_tokens + 8


def test_another_llm_reads_the_facts_as_text(engine: MemoryEngine,
                                             chat_ends: ChatEnds) -> None:
    fact = engine.memory.add("Nora's bike is red.", user_id="li-mock")
    chat = SimpleChatEngine.from_defaults(llm=MockLLM(),  # answers with its prompt
                                          memory=memory_for(engine, "li-mock", "li-mock-1"))
    prompt = chat.chat("What colour is Nora's bike?").response
    assert fact.text in prompt and fact.id not in prompt  # the text, not our bookkeeping
    system = [m for m in chat_ends.events[-1].messages if m.role == "system"]
    assert any(fact.text in (m.content or "") for m in system)


def test_condense_plus_context_sees_the_facts(engine: MemoryEngine,
                                              chat_ends: ChatEnds) -> None:
    fact = engine.memory.add("Omar is allergic to peanuts.", user_id="li-condense")
    documents = [Document(text="The bakery on Elm Street sells peanut cookies."),
                 Document(text="The museum opens at nine on Sundays.")]
    index = VectorStoreIndex.from_documents(documents, embed_model=InferScaleEmbedding(
        engine=engine))
    chat = CondensePlusContextChatEngine.from_defaults(
        index.as_retriever(similarity_top_k=1), llm=InferScaleLLM(engine=engine, max_tokens=8),
        memory=memory_for(engine, "li-condense", "li-condense-1"))
    chat.chat("Can I eat the cookies of the bakery?")
    condense, answer = chat_ends.events[-2:]
    condense_prompt = condense.messages[-1].content
    assert fact.text in condense_prompt and fact.id not in condense_prompt  # as text only
    assert answer.response.additional_kwargs["memory"]["fact_ids"] == [fact.id]


async def test_flushed_user_messages_can_become_facts(engine: MemoryEngine) -> None:
    block = InferScaleMemoryBlock(engine=engine, user_id="li-put", store_user_messages=True)
    await block.aput([ChatMessage(role="user", content="I moved to Lisbon."),
                      ChatMessage(role="assistant", content="Nice!")])
    assert [f.text for f in engine.memory.list(user_id="li-put")] == ["I moved to Lisbon."]

"""InferScaleMemoryBlock: a user's facts for LlamaIndex's ``Memory``, handed over for injection.

LlamaIndex's ``Memory`` puts what its blocks return into the prompt. This block returns
one system message with the retrieved facts as text, which also carries the facts
themselves (:mod:`llama_index_inferscale.handover`):
:class:`~llama_index_inferscale.InferScaleLLM` takes that message out of the conversation
and has the engine inject the facts' KV; any other LLM reads the facts' text. ``Memory``
counts the message as the facts' text, which is what the prompt holds either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import Field
from llama_index.core.memory.memory import BaseMemoryBlock

from inferscale_memory import MemoryEngine, ScoredFact, UnknownUserError
from inferscale_memory.integrations import default_engine
from llama_index_inferscale.handover import facts_message


class InferScaleMemoryBlock(BaseMemoryBlock[list[ChatMessage]]):
    """Long-term memory block: ``user_id``'s facts, injected as KV by :class:`InferScaleLLM`
    (and read as text by any other LLM).

    Example:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from llama_index.core.memory import Memory
            from llama_index_inferscale import InferScaleLLM, InferScaleMemoryBlock

            block = InferScaleMemoryBlock(engine=engine, user_id="caroline", k=5)
            memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
            chat = SimpleChatEngine.from_defaults(llm=InferScaleLLM(engine=engine),
                                                  memory=memory)
            chat.chat("Where does Caroline live?")
    """

    name: str = Field(default="inferscale_memory", description="The block's name.")
    engine: Any = Field(default=None, exclude=True,
                        description="The MemoryEngine; None shares a default engine.")
    user_id: str = Field(description="Whose facts to retrieve.")
    k: int = Field(default=10, description="Facts retrieved per turn.")
    store_user_messages: bool = Field(default=False, description=(
        "Store the user messages that Memory flushes from its short-term queue as facts "
        "(their KV is captured)."))

    def _engine(self) -> MemoryEngine:
        return self.engine if self.engine is not None else default_engine()

    async def _aget(self, messages: list[ChatMessage] | None = None,
                    **block_kwargs: Any) -> list[ChatMessage]:
        query = _last_user_text(messages or [])
        if not query:
            return []
        hits = await asyncio.to_thread(self._search, query)
        if not hits:
            return []
        return [facts_message(self.user_id, hits)]

    async def _aput(self, messages: list[ChatMessage]) -> None:
        if not self.store_user_messages:
            return
        texts = [m.content for m in messages if m.role == MessageRole.USER and m.content]
        if texts:
            await asyncio.to_thread(self._engine().memory.add, texts, user_id=self.user_id)

    def _search(self, query: str) -> list[ScoredFact]:
        try:
            return self._engine().memory.search(query, user_id=self.user_id, k=self.k)
        except UnknownUserError:
            return []


def _last_user_text(messages: list[ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == MessageRole.USER and message.content:
            return message.content
    return ""

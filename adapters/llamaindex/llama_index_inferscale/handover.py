"""The message in which :class:`InferScaleMemoryBlock` hands a user's facts to the LLM.

LlamaIndex's ``Memory`` counts a block's messages by their text and their
``additional_kwargs``, and an LLM reads only their text. So the message carries the facts
twice: as text (what ``Memory`` counts and what any LLM reads) and in a typed field,
:attr:`FactsMessage.inferscale_memory`, that ``Memory`` does not count and only
:class:`InferScaleLLM` reads: it takes the message out and has the engine inject the
facts' KV instead of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import Field

from inferscale_memory import Fact, ScoredFact

LEAD = "Known facts about the user:\n"


class FactsMessage(ChatMessage):
    """A system message with the facts as text, and the facts themselves for the engine."""

    inferscale_memory: dict[str, Any] = Field(description=(
        "{'user_id': ..., 'facts': [ScoredFact.to_dict(), ...]}; read by InferScaleLLM."))


def facts_message(user_id: str, hits: Sequence[ScoredFact]) -> FactsMessage:
    """The hand-over message for ``hits`` (best first), each fact as a ``- text`` line."""
    text = LEAD + "".join(f"- {hit.fact.text.strip()}\n" for hit in hits)
    return FactsMessage(role=MessageRole.SYSTEM, content=text, inferscale_memory={
        "user_id": user_id, "facts": [hit.to_dict() for hit in hits]})


def handed_facts(message: FactsMessage) -> tuple[str, list[ScoredFact]]:
    """The user id and facts that ``message`` hands over."""
    handed = message.inferscale_memory
    return handed["user_id"], [
        ScoredFact(Fact(item["id"], item["user_id"], item["text"], item["metadata"],
                        item["created_at"], item["updated_at"]), item["score"])
        for item in handed["facts"]]

"""Which of a user's facts ChatInferScale injects, and why an answer injected none.

A chain such as ``InferScaleRetriever | format | prompt | ChatInferScale`` pastes facts
into the prompt that the model would inject as well (both read
``configurable["user_id"]``). The model therefore retrieves as the engine does (the last
user message, top ``k``), leaves out the facts whose text a message already holds
(``response_metadata["memory"]["skipped_in_prompt"]``) and hands the engine the rest.

Facts added through Mem0 (``mem0_inferscale``) live in Mem0's store, which the model does
not read: a user without facts on an engine that a Mem0 memory is attached to gets a
warning, once per process, that says so.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

from inferscale_memory import ChatResult, MemoryEngine, ScoredFact, UnknownUserError

logger = logging.getLogger(__name__)
_warned_two_memories = False


def facts_for(engine: MemoryEngine, request: dict[str, Any]) -> list[str]:
    """Put the user's facts that the prompt does not hold into ``request["facts"]``;
    returns the ids of those it does hold (skipped)."""
    if (query := _query(engine, request)) is None:
        return []
    try:
        found = engine.memory.search(query, user_id=request["user_id"], k=_k(engine, request))
    except UnknownUserError:
        return []  # no facts yet: the engine answers without memory
    return _keep_unpasted(request, found)


async def afacts_for(engine: MemoryEngine, request: dict[str, Any]) -> list[str]:
    """:func:`facts_for` for async callers (any event loop)."""
    if (query := _query(engine, request)) is None:
        return []
    try:
        found = await engine.memory.asearch(query, user_id=request["user_id"],
                                            k=_k(engine, request))
    except UnknownUserError:
        return []
    return _keep_unpasted(request, found)


def split_pasted(facts: Sequence[ScoredFact], messages: Sequence[dict[str, str]]
                 ) -> tuple[list[ScoredFact], list[str]]:
    """``facts`` whose text no message contains (whitespace aside), and the others' ids."""
    prompt = [" ".join(message["content"].split()) for message in messages]
    kept, skipped = [], []
    for scored in facts:
        text = " ".join(scored.fact.text.split())
        if text and any(text in content for content in prompt):
            skipped.append(scored.fact.id)
        else:
            kept.append(scored)
    return kept, skipped


def without_memory(engine: MemoryEngine, result: ChatResult, user_id: str | None,
                   skipped: Sequence[str]) -> str | None:
    """Why an answer used no fact (``None`` when it used some)."""
    if result.metrics.memory_used:
        return None
    if user_id is None:
        return ("no user_id: set it on the model, per call, or in config['configurable']"
                "['user_id']")
    if skipped:
        return "the user's facts are in the prompt already (skipped_in_prompt)"
    if _mem0_attached(engine):
        return _two_memories(user_id)
    return f"user {user_id!r} has no facts yet (add them with engine.memory.add)"


def _query(engine: MemoryEngine, request: dict[str, Any]) -> str | None:
    """The engine's retrieval query, or ``None`` where the engine retrieves nothing or
    refuses the request (it then says why)."""
    messages, k = request["messages"], _k(engine, request)
    if request["user_id"] is None or not messages or messages[-1]["role"] != "user":
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        return None
    return messages[-1]["content"]


def _k(engine: MemoryEngine, request: dict[str, Any]) -> Any:
    return engine.config.k if request.get("k") is None else request["k"]


def _keep_unpasted(request: dict[str, Any], found: list[ScoredFact]) -> list[str]:
    request["facts"], skipped = split_pasted(found, request["messages"])
    return skipped


def _mem0_attached(engine: MemoryEngine) -> bool:
    # Only an imported mem0_inferscale can have attached a Mem0 memory to the engine.
    mem0 = sys.modules.get("mem0_inferscale")
    return mem0 is not None and bool(mem0.attached(engine))


def _two_memories(user_id: str) -> str:
    global _warned_two_memories
    note = (f"user {user_id!r} has no facts in the engine's store, but a Mem0 memory is "
            "attached to this engine: facts added through Mem0 live in Mem0's store, which "
            "ChatInferScale does not read. Answer them with mem0_inferscale.answer(memory, "
            "query, user_id=...), or add them with engine.memory.add (docs/adapters.md, "
            "'Two memories')")
    if not _warned_two_memories:
        _warned_two_memories = True
        logger.warning("%s", note)
    return note

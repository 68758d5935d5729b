"""Mem0's fact extraction on a small context: the compact prompt and the JSON it asks for.

Mem0 2.2.1's ``add(..., infer=True)`` makes one LLM call: its system prompt
(``ADDITIVE_EXTRACTION_PROMPT``, about 8,600 SmolLM2 tokens, plus ``AGENT_CONTEXT_SUFFIX``
for an agent's memories), a user prompt with the conversation, existing memories, dates
and any ``custom_instructions``, and ``response_format={"type": "json_object"}``. It reads
``{"memory": [{"id", "text", "attributed_to"}, ...]}`` back. Mem0 has no option to replace
that system prompt (``custom_instructions`` and ``add(prompt=...)`` only append to the user
prompt), so :func:`fit_extraction` does it where it must: when Mem0's messages and the
answer do not fit the model's context, the system prompt becomes
:data:`COMPACT_EXTRACTION_PROMPT` (Mem0's agent suffix kept); the user prompt is Mem0's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mem0.configs import prompts as mem0_prompts

# Our own short instructions for the same task and the same JSON as Mem0's prompt (no
# example fact: a small model copies it).
COMPACT_EXTRACTION_PROMPT = """\
You keep the memory of an assistant. Read the New Messages and write down each new fact \
worth remembering about the user: name, home, work, family, plans, preferences; and what \
the assistant recommended or did. Write one short sentence per fact, in the third person, \
with the names, places, dates and numbers of the messages. Leave out greetings, \
questions, small talk and facts already in Existing Memories. Follow the Custom \
Instructions, if any.

Answer with JSON only: {"memory": [{"id": "0", "text": "<one fact>", "attributed_to": \
"user"}]}. Number the ids "0", "1", ... in order. attributed_to is "user" for what the \
user said, "assistant" for what the assistant said or did. Nothing to remember: \
{"memory": []}."""

MAX_MEMORIES = 8  # per add(); with MAX_TEXT_CHARS, the JSON ends well within 512 tokens
MAX_TEXT_CHARS = 200  # a small model may not end a sentence on its own
# The answer Mem0 parses (``json.loads(...).get("memory")``; it reads "text" and
# "attributed_to"), as a JSON schema for guided decoding.
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memory": {"type": "array", "maxItems": MAX_MEMORIES, "items": {
        "type": "object",
        "properties": {"id": {"type": "string", "maxLength": 2},
                       "text": {"type": "string", "minLength": 1,
                                "maxLength": MAX_TEXT_CHARS},
                       "attributed_to": {"type": "string", "enum": ["user", "assistant"]}},
        "required": ["id", "text", "attributed_to"],
        "additionalProperties": False}}},
    "required": ["memory"],
    "additionalProperties": False,
}
EXTRACTION_FORMAT = {"type": "json_schema",
                     "json_schema": {"name": "mem0_memories", "schema": EXTRACTION_SCHEMA}}


def is_extraction(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether ``messages`` are Mem0's extraction call (its system prompt first)."""
    mem0_prompt = getattr(mem0_prompts, "ADDITIVE_EXTRACTION_PROMPT", None)
    first = messages[0] if messages else {}
    return (mem0_prompt is not None and first.get("role") == "system"
            and isinstance(first.get("content"), str)
            and first["content"].startswith(mem0_prompt))


def fit_extraction(messages: Sequence[dict[str, Any]],
                   count_tokens: Callable[[list[dict[str, Any]]], int],
                   limit: int) -> list[dict[str, Any]]:
    """Mem0's extraction ``messages``, or, if they take more than ``limit`` tokens (the
    model's context less the answer's ``max_tokens``), the same with the compact system
    prompt.

    Args:
        messages: Mem0's extraction call (:func:`is_extraction`).
        count_tokens: The prompt's length in the model's tokens
            (``MemoryEngine.count_prompt_tokens``).
        limit: Tokens the prompt may take.
    """
    messages = [dict(m) for m in messages]
    if count_tokens(messages) <= limit:
        return messages
    agent_suffix = messages[0]["content"][len(mem0_prompts.ADDITIVE_EXTRACTION_PROMPT):]
    messages[0]["content"] = COMPACT_EXTRACTION_PROMPT + agent_suffix
    return messages

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

A small model may still answer with memories that are no facts (SmolLM2-135M, for "Hi,
I'm Omar. I grow tomatoes on my balcony and I work as a baker in Madrid.", wrote one memory
of the whole message and "I'm a baker in Madrid." again and again, cut at 200 characters).
:func:`extraction_problems` finds what is plainly wrong, and :class:`ExtractionError`
refuses such an answer before Mem0 stores it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from mem0.configs import prompts as mem0_prompts

from inferscale_memory import InferScaleError

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


class ExtractionError(InferScaleError):
    """The model's memories for an ``add(..., infer=True)`` are plainly wrong (cut,
    repeated, empty, one word): Mem0 stores none of them (it raises its ``LLMError`` from
    this)."""

    def __init__(self, model: str, problems: Sequence[str]) -> None:
        super().__init__(
            f"{model} could not extract memories from these messages "
            f"({'; '.join(problems)}), so none are stored. Pass infer=False to store the "
            "messages as they are, or give Mem0 a larger instruct model that extracts facts "
            "(a model of 135M parameters often cannot)")
        self.problems = list(problems)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def extraction_problems(answer: str, finished: bool = True) -> list[str]:
    """What is plainly wrong with an extraction ``answer`` (the JSON of
    :data:`EXTRACTION_SCHEMA`); empty when nothing is. ``finished``: the answer ended on its
    own (not at ``max_tokens``).

    Example:
        >>> extraction_problems(json.dumps({"memory": [{"id": "0", "attributed_to": "user",
        ...     "text": "Omar is a baker. Omar is a baker."}]}))
        ['"Omar is a baker." repeated 2 times in one memory']
    """
    if not finished:
        return [f"the answer reached max_tokens before its JSON ended: {answer[-60:]!r}"]
    texts = [m["text"] for m in json.loads(answer)["memory"]]
    problems = [f'a memory cut at {MAX_TEXT_CHARS} characters ("...{t[-30:]}")'
                for t in texts if len(t) >= MAX_TEXT_CHARS]
    problems += ["an empty memory" for t in texts if not t.strip()]
    problems += [f'"{t.strip()}", one word, is no fact' for t in texts if len(t.split()) == 1]
    for text in texts:
        sentences = Counter(_norm(s) for s in _SENTENCE_END.split(text.strip()) if _norm(s))
        problems += [f'"{s}" repeated {n} times in one memory'
                     for s, n in sentences.items() if n > 1]
    problems += [f'"{t}" written {n} times'
                 for t, n in Counter(_norm(t) for t in texts if t.strip()).items() if n > 1]
    return problems


def _norm(text: str) -> str:
    return " ".join(text.split())

"""Guided JSON on a real engine (the shared SmolLM2 one) is written as instruct models write
JSON: ``", "`` between items, ``": "`` after a key, no other whitespace (issue 31, item 5).
With compact JSON forced (vLLM's ``disable_any_whitespace``, until then) a real instruct
model extracted nothing from a message it extracts well unguided (docs/adapters.md).

The grammar itself: ``tests/driver/test_guided_json.py``; schemas that fail:
``tests/test_engine_tools.py``.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "Where does Caroline live, and what does she like?"}]
# Every answer it admits has both separators: two properties, one an array of two.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "likes"],
          "properties": {"city": {"type": "string", "maxLength": 20},
                         "likes": {"type": "array", "minItems": 2, "maxItems": 2,
                                   "items": {"type": "string", "enum": ["tea", "cats"]}}}}
TOOL = {"type": "function", "function": {
    "name": "describe", "description": "Describe where someone lives and what they like.",
    "parameters": SCHEMA}}
# A separator without its space, or whitespace other than the separators' one space,
# outside strings (no answer here has a string holding them).
NOT_SPACED = re.compile(r'["\]}\d],["\[{\d]|":["\[{\d]|\s{2}|\n')


def assert_spaced(text: str) -> None:
    assert ", " in text and ": " in text, text
    assert not NOT_SPACED.search(text), text


def test_a_json_schema_answer_has_the_models_separators(engine: MemoryEngine) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    reply = engine.chat(QUESTION, max_tokens=64, response_format=fmt)
    assert reply.finish_reason == "stop", reply.text
    assert_spaced(reply.text)
    jsonschema.validate(json.loads(reply.text), SCHEMA)


def test_a_json_object_answer_has_the_models_separators(engine: MemoryEngine) -> None:
    reply = engine.chat(QUESTION, max_tokens=64, response_format={"type": "json_object"})
    assert reply.text.startswith("{")
    assert ": " in reply.text and not NOT_SPACED.search(reply.text), reply.text
    if reply.finish_reason == "stop":
        assert isinstance(json.loads(reply.text), dict)


def test_a_forced_tool_calls_arguments_have_the_models_separators(engine: MemoryEngine
                                                                  ) -> None:
    reply = engine.chat(QUESTION, max_tokens=64, tools=[TOOL], tool_choice={
        "type": "function", "function": {"name": "describe"}})
    assert reply.finish_reason == "tool_calls", reply.text
    [call] = reply.tool_calls
    assert_spaced(call.arguments)
    jsonschema.validate(json.loads(call.arguments), SCHEMA)


def test_the_engine_readies_guided_decoding_as_it_starts(engine: MemoryEngine) -> None:
    """vLLM's engine core builds its grammar backend (xgrammar's view of the tokenizer's
    vocabulary) on the first guided request it is sent, inside its scheduling loop: on an
    H200 host with Qwen's 151k-token vocabulary every other request waited ~0.6 s for it
    (docs/reliability.md). The runtime sends a guided request of its own as vLLM starts,
    so no user's request pays for that: its answer is the one its grammar admits."""
    from inferscale_memory.runtime import GUIDED_WARMUP

    warmup = engine.runtime.guided_warmup
    assert warmup is not None and warmup.text == GUIDED_WARMUP, warmup

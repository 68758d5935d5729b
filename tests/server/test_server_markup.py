"""The server never answers with our tool prompt's tags, which SmolLM2 echoes after a tool
result: neither in a message nor in a stream's deltas."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from server_helpers import add_facts, openai_client

from inferscale_memory.markup import strip_markup

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine
USER = "srv-markup"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}
RESULT = "12 C and rain in Berlin"
# An agent's second step, which SmolLM2 answers (greedy) with "<tool_response>\n12 C ...".
TURNS = [{"role": "user", "content": "Should Caroline take an umbrella?"},
         {"role": "assistant", "content": "", "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]


def test_an_echoed_tool_result_is_answered_without_our_tags(server: ServerHandle, model: str,
                                                            engine: MemoryEngine) -> None:
    add_facts(server, USER, ["Caroline moved to Berlin in May 2023.",
                             "Caroline has a dog called Biscuit."])
    options = dict(max_tokens=40, tools=[WEATHER], user=USER,
                   extra_body={"memory": {"k": 1}})
    echoed = engine.chat(TURNS, user_id=USER, k=1, max_tokens=40, tools=[WEATHER]).text
    assert "<tool_response>" in echoed  # what the engine's model answers here
    shown = strip_markup(echoed)
    assert RESULT in shown and "<tool_" not in shown

    client = openai_client(server)
    reply = client.chat.completions.create(model=model, messages=TURNS, **options)
    assert reply.choices[0].message.content == shown
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=TURNS, stream=True, **options) if c.choices]
    assert "".join(deltas) == shown

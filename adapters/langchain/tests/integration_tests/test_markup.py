"""ChatInferScale never shows our tool prompt's tags, which SmolLM2 echoes after a tool result."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from inferscale_memory import MemoryEngine
from inferscale_memory.markup import strip_markup
from langchain_inferscale import ChatInferScale

pytestmark = pytest.mark.engine
USER = "lc-markup"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION = "Should Caroline take an umbrella?"
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}
RESULT = "12 C and rain in Berlin"
# An agent's second step, which SmolLM2 answers (greedy) with "<tool_response>\n12 C ...".
TURNS = [{"role": "user", "content": QUESTION},
         {"role": "assistant", "content": "", "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]


def test_an_echoed_tool_result_is_shown_without_our_tags(engine: MemoryEngine) -> None:
    engine.memory.add(["Caroline moved to Berlin in May 2023.",
                       "Caroline has a dog called Biscuit."], user_id=USER)
    options = dict(user_id=USER, k=1, max_tokens=40)
    echoed = engine.chat(TURNS, tools=[WEATHER], **options).text
    assert "<tool_response>" in echoed  # what the engine's model answers here

    llm = ChatInferScale(engine=engine, **options)
    turns = [HumanMessage(QUESTION),
             AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Berlin"},
                                        "id": "call_1"}]),
             ToolMessage(RESULT, tool_call_id="call_1")]
    reply = llm.invoke(turns, tools=[WEATHER])
    streamed = "".join(str(chunk.content) for chunk in llm.stream(turns, tools=[WEATHER]))
    assert reply.content == streamed == strip_markup(echoed)
    assert RESULT in reply.content and "<tool_" not in reply.content

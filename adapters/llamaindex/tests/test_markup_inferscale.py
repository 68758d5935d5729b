"""InferScaleLLM never shows our tool prompt's tags, which SmolLM2 echoes after a tool result."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from inferscale_memory import MemoryEngine
from inferscale_memory.markup import strip_markup
from llama_index_inferscale import InferScaleLLM

pytestmark = pytest.mark.engine
USER = "li-markup"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION = "Should Caroline take an umbrella?"
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}
RESULT = "12 C and rain in Berlin"
# A FunctionAgent's second step, which SmolLM2 answers (greedy) with "<tool_response>...".
TURNS = [{"role": "user", "content": QUESTION},
         {"role": "assistant", "content": "", "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]


async def test_an_echoed_tool_result_is_shown_without_our_tags(engine: MemoryEngine) -> None:
    engine.memory.add(["Caroline moved to Berlin in May 2023.",
                       "Caroline has a dog called Biscuit."], user_id=USER)
    options = dict(user_id=USER, k=1, max_tokens=40)
    echoed = (await engine.achat(TURNS, tools=[WEATHER], **options)).text
    assert "<tool_response>" in echoed  # what the engine's model answers here

    llm = InferScaleLLM(engine=engine, **options)
    turns = [ChatMessage(role=MessageRole.USER, content=QUESTION),
             ChatMessage(role=MessageRole.ASSISTANT, content="",
                         additional_kwargs={"tool_calls": [CALL]}),
             ChatMessage(role=MessageRole.TOOL, content=RESULT,
                         additional_kwargs={"tool_call_id": "call_1"})]
    shown = strip_markup(echoed)
    assert RESULT in shown and "<tool_" not in shown
    assert llm.chat(turns, tools=[WEATHER]).message.content == shown
    assert list(llm.stream_chat(turns, tools=[WEATHER]))[-1].message.content == shown
    assert (await llm.achat(turns, tools=[WEATHER])).message.content == shown
    streamed = [r async for r in await llm.astream_chat(turns, tools=[WEATHER])]
    assert "".join(r.delta or "" for r in streamed) == streamed[-1].message.content == shown

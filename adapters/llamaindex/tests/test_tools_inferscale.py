"""InferScaleLLM as a LlamaIndex FunctionCallingLLM on a real engine, facts injected as KV.

The engine (``tool_engine`` in the root conftest) has a small random-weight model with
Qwen2.5's tool template: guided decoding makes it produce calls that parse, so these
tests check the LlamaIndex mechanics, not the model's judgement.
"""

from __future__ import annotations

from typing import Literal

import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, ConfigDict

from inferscale_memory import InvalidInputError, MemoryEngine
from llama_index_inferscale import InferScaleLLM

pytestmark = pytest.mark.engine
USER = "li-tools"
QUESTION = "What is the weather where Caroline lives?"


class WeatherArgs(BaseModel):
    # No other keys (additionalProperties false): random weights would go on adding keys.
    model_config = ConfigDict(extra="forbid")

    city: Literal["Berlin", "Paris"]


def get_weather(city: str) -> str:
    """The weather in a city now."""
    return f"sunny in {city}"


WEATHER = FunctionTool.from_defaults(fn=get_weather, fn_schema=WeatherArgs)


@pytest.fixture(scope="module")
def llm(tool_engine: MemoryEngine) -> InferScaleLLM:
    tool_engine.memory.add("Caroline moved to Berlin in May 2023.", user_id=USER)
    return InferScaleLLM(engine=tool_engine, user_id=USER, k=1, max_tokens=200)


def used_memory(response: ChatResponse) -> bool:
    memory = response.additional_kwargs["memory"]
    return bool(memory["memory_used"] and memory["fact_ids"])


def test_the_tool_template_makes_it_a_function_calling_model(llm: InferScaleLLM,
                                                             engine: MemoryEngine) -> None:
    assert llm.metadata.is_function_calling_model
    # SmolLM2's template has no tools: the engine's own tool prompt makes it one too.
    assert InferScaleLLM(engine=engine).metadata.is_function_calling_model


def test_a_required_call_is_read_and_its_result_answered(llm: InferScaleLLM,
                                                         tool_engine: MemoryEngine) -> None:
    tool_engine.reset_prefix_cache()  # else the fact may come from vLLM's prefix cache
    response = llm.chat_with_tools([WEATHER], user_msg=QUESTION, tool_required=True)
    assert response.additional_kwargs["memory"]["injected_tokens"] > 0
    calls = llm.get_tool_calls_from_response(response)
    assert [c.tool_name for c in calls] == ["get_weather"]
    assert calls[0].tool_kwargs["city"] in ("Berlin", "Paris")

    result = ChatMessage(role=MessageRole.TOOL, content=get_weather(**calls[0].tool_kwargs),
                         additional_kwargs={"tool_call_id": calls[0].tool_id})
    history = [ChatMessage(role="user", content=QUESTION), response.message, result]
    answer = llm.chat(history, tool_choice="none", tools=[WEATHER.metadata.to_openai_tool()])
    assert isinstance(answer.message.content, str) and used_memory(answer)
    assert not llm.get_tool_calls_from_response(answer, error_on_no_tool_call=False)
    with pytest.raises(ValueError, match="at least one tool call"):
        llm.get_tool_calls_from_response(answer)


def test_predict_and_call_runs_the_named_tool(llm: InferScaleLLM) -> None:
    output = llm.predict_and_call([WEATHER], user_msg=QUESTION, tool_choice="get_weather")
    assert output.response.startswith("sunny in ")
    assert [s.tool_name for s in output.sources] == ["get_weather"]


def test_a_streamed_call_arrives_with_the_last_response(llm: InferScaleLLM) -> None:
    responses = list(llm.stream_chat_with_tools([WEATHER], user_msg=QUESTION,
                                                tool_required=True))
    calls = llm.get_tool_calls_from_response(responses[-1])
    assert [c.tool_name for c in calls] == ["get_weather"] and used_memory(responses[-1])


def test_a_model_without_a_tool_template_calls_tools_through_our_tool_prompt(
        engine: MemoryEngine) -> None:
    engine.memory.add("Caroline moved to Berlin in May 2023.", user_id=USER)
    smol = InferScaleLLM(engine=engine, user_id=USER, k=1, max_tokens=40)
    response = smol.chat_with_tools([WEATHER], user_msg=QUESTION, tool_required=True)
    calls = smol.get_tool_calls_from_response(response)
    assert [c.tool_name for c in calls] == ["get_weather"] and used_memory(response)
    assert calls[0].tool_kwargs["city"] in ("Berlin", "Paris")


def test_tools_are_refused_once_the_engines_tool_parser_is_none(engine: MemoryEngine) -> None:
    parser, engine.tool_parser = engine.tool_parser, None
    try:
        plain = InferScaleLLM(engine=engine, user_id=USER, k=1, max_tokens=4)
        assert not plain.metadata.is_function_calling_model
        with pytest.raises(InvalidInputError, match="tool_parser is None"):
            plain.chat_with_tools([WEATHER], user_msg=QUESTION)
    finally:
        engine.tool_parser = parser
    assert engine.healthy

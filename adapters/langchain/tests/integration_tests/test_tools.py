"""ChatInferScale with tools and structured output on a real engine, facts injected as KV.

The engine (``tool_engine`` in the root conftest) has a small random-weight model with
Qwen2.5's tool template: guided decoding makes it produce calls and JSON that parse, so
these tests check the LangChain mechanics, not the model's judgement.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic import BaseModel, ConfigDict

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale

pytestmark = pytest.mark.engine
USER = "lc-tools"
QUESTION = "What is the weather where Caroline lives?"


class City(BaseModel):
    """Where someone lives."""

    # No other keys (additionalProperties false): random weights would go on adding keys.
    model_config = ConfigDict(extra="forbid")

    city: Literal["Berlin", "Paris", "Rome"]
    sure: bool


def get_weather(city: Literal["Berlin", "Paris"]) -> str:
    """The weather in a city now."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def llm(tool_engine: MemoryEngine) -> ChatInferScale:
    tool_engine.memory.add("Caroline moved to Berlin in May 2023.", user_id=USER)
    return ChatInferScale(engine=tool_engine, user_id=USER, k=1, max_tokens=200)


def injected(message: Any) -> int:
    return int(message.response_metadata["memory"]["injected_tokens"])


def used_memory(message: Any) -> bool:
    memory = message.response_metadata["memory"]
    return bool(memory["memory_used"] and memory["fact_ids"])


def test_a_bound_tool_is_called_and_its_result_answered(llm: ChatInferScale,
                                                        tool_engine: MemoryEngine) -> None:
    tool_engine.reset_prefix_cache()  # else the fact may come from vLLM's prefix cache
    call = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(QUESTION)
    assert isinstance(call, AIMessage) and injected(call) > 0
    assert [c["name"] for c in call.tool_calls] == ["get_weather"] and not call.invalid_tool_calls
    args = call.tool_calls[0]["args"]
    assert set(args) == {"city"} and args["city"] in ("Berlin", "Paris")
    assert call.response_metadata["finish_reason"] == "tool_calls"

    result = ToolMessage(get_weather(**args), tool_call_id=call.tool_calls[0]["id"])
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(
        [HumanMessage(QUESTION), call, result])
    assert isinstance(answer.content, str) and not answer.tool_calls
    assert used_memory(answer)


def test_a_required_call_streams_as_tool_call_chunks(llm: ChatInferScale) -> None:
    chunks = list(llm.bind_tools([get_weather], tool_choice="any",
                                 parallel_tool_calls=False).stream(QUESTION))
    assert any(chunk.tool_call_chunks for chunk in chunks)
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert [c["name"] for c in whole.tool_calls] == ["get_weather"]
    assert whole.tool_calls[0]["args"]["city"] in ("Berlin", "Paris")
    assert used_memory(whole)


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_structured_output_parses_into_the_schema(llm: ChatInferScale, method: str) -> None:
    answer = llm.with_structured_output(City, method=method).invoke(  # type: ignore[arg-type]
        "Where does Caroline live?")
    assert isinstance(answer, City)
    raw = llm.with_structured_output(City.model_json_schema(), method=method,  # type: ignore[arg-type]
                                     include_raw=True).invoke("Where does Caroline live?")
    assert raw["parsing_error"] is None and isinstance(raw["raw"], AIMessage)
    assert City.model_validate(raw["parsed"]) and used_memory(raw["raw"])


def test_a_model_without_a_tool_template_calls_tools_through_our_tool_prompt(
        engine: MemoryEngine) -> None:
    # SmolLM2 (the default): the engine writes the tools into the prompt itself.
    engine.memory.add("Caroline moved to Berlin in May 2023.", user_id=USER)
    smol = ChatInferScale(engine=engine, user_id=USER, k=1, max_tokens=40)
    call = smol.bind_tools([get_weather], tool_choice="any",
                           parallel_tool_calls=False).invoke(QUESTION)
    assert [c["name"] for c in call.tool_calls] == ["get_weather"] and used_memory(call)
    assert call.tool_calls[0]["args"]["city"] in ("Berlin", "Paris")
    result = ToolMessage(get_weather(**call.tool_calls[0]["args"]),
                         tool_call_id=call.tool_calls[0]["id"])
    answer = smol.bind_tools([get_weather], tool_choice="none").invoke(
        [HumanMessage(QUESTION), call, result])
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls
    assert used_memory(answer)

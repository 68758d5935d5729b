"""Tools and structured output through the server, with the official ``openai`` client.

The server runs over ``tool_engine`` (random weights, Qwen2.5's tool template): guided
decoding makes its calls parseable; the user's fact is injected as KV in every answer. The
default ``server`` (SmolLM2, whose template has no tools) answers with our own tool prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import jsonschema
import pytest
from pydantic import BaseModel
from server_helpers import add_facts, assert_openai_error, http, openai_client

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

USER = "srv-tools"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "enum": ["Berlin", "Paris"]}}}}}
QUESTION = [{"role": "user", "content": "What is the weather where Caroline lives?"}]


class Answer(BaseModel):
    city: Literal["Berlin", "Paris", "Rome"]
    sure: bool


@pytest.fixture(scope="module")
def tool_server(tool_engine: MemoryEngine) -> Iterator[ServerHandle]:
    from inferscale_memory.server import create_app, start_server

    handle = start_server(create_app(tool_engine, None, metrics_refresh_s=0), tool_engine)
    add_facts(handle, USER, "Caroline moved to Berlin in May 2023.", key=None)  # type: ignore[arg-type]
    yield handle
    handle.stop(timeout=60)


@pytest.fixture(scope="module")
def model(tool_engine: MemoryEngine) -> str:
    return tool_engine.model_path.name


def test_required_tool_call(tool_server: ServerHandle, model: str,
                            tool_engine: MemoryEngine) -> None:
    tool_engine.reset_prefix_cache()  # the fact's block is injected, not a prefix-cache hit
    reply = openai_client(tool_server).chat.completions.create(
        model=model, messages=QUESTION, user=USER, max_tokens=200, tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].type == "function" and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments),
                        WEATHER["function"]["parameters"])
    assert reply.usage is not None and reply.usage.injected_tokens > 0  # type: ignore[attr-defined]


def test_streamed_tool_call_deltas(tool_server: ServerHandle, model: str,
                                   tool_engine: MemoryEngine) -> None:
    tool_engine.reset_prefix_cache()
    stream = openai_client(tool_server).chat.completions.create(
        model=model, messages=QUESTION, user=USER, max_tokens=200, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) >= 2
    assert deltas[0].id and deltas[0].type == "function"
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and not d.id for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finishing] == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.injected_tokens > 0  # type: ignore[attr-defined]


def test_the_openai_client_streams_into_whole_calls(tool_server: ServerHandle,
                                                    model: str) -> None:
    client = openai_client(tool_server)
    with client.chat.completions.stream(
            model=model, messages=QUESTION, user=USER, max_tokens=200, tools=[WEATHER],
            tool_choice="required", parallel_tool_calls=False) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments),
                        WEATHER["function"]["parameters"])


def test_tool_result_then_answer(tool_server: ServerHandle, model: str,
                                 tool_engine: MemoryEngine) -> None:
    tool_engine.reset_prefix_cache()
    messages = [*QUESTION,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C and rain"}]
    reply = openai_client(tool_server).chat.completions.create(
        model=model, messages=messages, user=USER, max_tokens=8, tools=[WEATHER],  # type: ignore[arg-type]
        tool_choice="none")
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.injected_tokens > 0  # type: ignore[attr-defined]


def test_parse_with_a_pydantic_model(tool_server: ServerHandle, model: str,
                                     tool_engine: MemoryEngine) -> None:
    tool_engine.reset_prefix_cache()
    reply = openai_client(tool_server).chat.completions.parse(
        model=model, messages=QUESTION, user=USER, max_tokens=200, response_format=Answer)
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, Answer)
    assert reply.usage is not None and reply.usage.injected_tokens > 0  # type: ignore[attr-defined]


def test_bad_tool_requests_are_400s(tool_server: ServerHandle, model: str) -> None:
    bodies = [
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": "required"},
        {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        {"response_format": {"type": "xml"}},
        {"functions": [{"name": "f"}]},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": "x"}}}}}},
    ]
    with http(tool_server, key=None) as client:
        for extra in bodies:
            response = client.post("/chat/completions", json={
                "model": model, "messages": QUESTION, "max_tokens": 4, **extra})
            assert_openai_error(response, 400)


def test_a_model_without_a_tool_template_calls_and_answers_through_our_tool_prompt(
        server: ServerHandle, engine: MemoryEngine) -> None:
    add_facts(server, "srv-smol-tools", "Caroline moved to Berlin in May 2023.")
    client, model = openai_client(server), engine.model_path.name
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, user="srv-smol-tools", max_tokens=40, tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=False)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls is not None
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments),
                        WEATHER["function"]["parameters"])
    messages = [*QUESTION, reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": calls[0].id, "content": "12 C and rain"}]
    answer = client.chat.completions.create(
        model=model, messages=messages, user="srv-smol-tools", max_tokens=16,  # type: ignore[arg-type]
        tools=[WEATHER])
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls

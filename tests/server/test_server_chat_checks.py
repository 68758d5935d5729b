"""A chat is checked once, by the engine's checkers, whichever way it comes in (issue 32):
the server refuses an invalid chat (messages, tools, tool_choice, response_format, sampling
and memory options) with the engine's own error, a request's messages, tools, options and
schemas pass their checkers once, and the OpenAPI document shows the engine's shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from server_helpers import ask, assert_openai_error, http

import inferscale_memory.conversation
import inferscale_memory.options
import inferscale_memory.tools.checks
from inferscale_memory import InvalidInputError
from inferscale_memory.conversation import ROLES
from inferscale_memory.fields import FACT_ORDERS, MAX_STOPS, SEED_MAX
from inferscale_memory.server.schemas import MAX_K
from inferscale_memory.tools.shapes import RESPONSE_FORMATS, TOOL_CHOICES, TOOL_NAME

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}
CALLED = [*ask("Weather in Berlin?"), {"role": "assistant", "content": None,
                                       "tool_calls": [CALL]}]


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}


def function(**changes: Any) -> dict[str, Any]:
    return {"type": "function", "function": {**WEATHER["function"], **changes}}


# Chats that one of the engine's checkers refuses; the server's request schema shows their
# shapes and passes them on.
INVALID_CHATS: dict[str, dict[str, Any]] = {
    # messages
    "orphan-result": {"messages": [
        *ask("Hi"), {"role": "tool", "tool_call_id": "call_1", "content": "12"}]},
    "no-tool-call-id": {"messages": [*CALLED, {"role": "tool", "content": "12"}]},
    "arguments-not-json": {"messages": [*ask("Hi"), {"role": "assistant", "content": None,
                                                     "tool_calls": [{**CALL, "function": {
                                                         "name": "f", "arguments": "no"}}]},
                                        *ask("And?")]},
    "call-without-function": {"messages": [*ask("Hi"), {"role": "assistant", "content": None,
                                                        "tool_calls": [{"id": "c"}]},
                                           *ask("And?")]},
    "assistant-last": {"messages": ask("Hi") + [{"role": "assistant", "content": "Hello"}]},
    "no-messages": {"messages": []},
    "messages-a-string": {"messages": "Hi"},
    "unknown-role": {"messages": [{"role": "robot", "content": "Hi"}]},
    "content-a-number": {"messages": [{"role": "user", "content": 42}]},
    "image-part": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]},
    "name-a-number": {"messages": [{"role": "user", "content": "Hi", "name": 5}]},
    # schemas
    "admits-nothing": {"response_format": json_schema({"type": []})},
    "nested-pattern": {"response_format": json_schema({"type": "string", "pattern": "^(a+)+$"})},
    # tools and tool_choice
    "same-tool-twice": {"tools": [WEATHER, WEATHER]},
    "unknown-named-tool": {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}},
    "tools-a-string": {"tools": "get_weather"},
    "tool-without-function": {"tools": [{"type": "function"}]},
    "bad-tool-name": {"tools": [function(name="bad name!")]},
    "description-a-number": {"tools": [function(description=5)]},
    "parameters-a-list": {"tools": [function(parameters=[])]},
    "unknown-tool-choice": {"tools": [WEATHER], "tool_choice": "always"},
    "required-without-tools": {"tool_choice": "required"},
    "parallel-a-string": {"tools": [WEATHER], "parallel_tool_calls": "yes"},
    # response_format
    "xml-format": {"response_format": {"type": "xml"}},
    "json-schema-missing": {"response_format": {"type": "json_schema"}},
    "format-name-too-long": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "n" * 65, "schema": {"type": "object"}}}},
    # sampling options
    "temperature-a-string": {"temperature": "hot"},
    "temperature-too-high": {"temperature": 9},
    "top_p-zero": {"top_p": 0},
    "top_k-negative": {"top_k": -1},
    "presence-too-high": {"presence_penalty": 3},
    "frequency-a-string": {"frequency_penalty": "1"},
    "stop-numbers": {"stop": [1, 2]},
    "stop-empty": {"stop": ""},
    "seed-too-big": {"seed": SEED_MAX + 1},
    "max_tokens-zero": {"max_tokens": 0},
    "max_tokens-a-float": {"max_tokens": 4.0},
    "max_completion_tokens-zero": {"max_completion_tokens": 0},
    "ignore_eos-a-string": {"ignore_eos": "yes"},
}


@pytest.mark.parametrize("chat", INVALID_CHATS.values(), ids=INVALID_CHATS.keys())
def test_the_engine_and_the_server_refuse_an_invalid_chat_alike(
        server: ServerHandle, engine: MemoryEngine, model: str, chat: dict[str, Any]) -> None:
    """Same message, same param: the server's refusal is the engine's (its request schema
    checks none of it again)."""
    options = {"max_tokens": 2, **{key: value for key, value in chat.items()
                                   if key != "messages"}}
    with pytest.raises(InvalidInputError) as caught:
        engine.chat(chat["messages"] if "messages" in chat else ask("Hi"), memory=False,
                    **options)
    assert caught.value.param is not None, caught.value
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, "messages": ask("Hi"), "max_tokens": 2, **chat})
    assert_openai_error(response, 400)
    error = response.json()["error"]
    assert (error["message"], error["param"]) == (str(caught.value), caught.value.param)


# Memory options that the engine refuses as its arguments of the same name (k,
# fact_order, recompute_tail); the request names them under ``memory``. On the old code
# the server's schema refused them first, without the value ("memory.k: Input should be
# greater than or equal to 1"): every case here differed there by its "; got ..." part.
INVALID_MEMORY: dict[str, dict[str, Any]] = {
    "k-zero": {"k": 0},
    "k-negative": {"k": -3},
    "k-bool": {"k": True},
    "k-float": {"k": 2.5},
    "k-integral-float": {"k": 2.0},
    "k-string": {"k": "3"},
    "k-list": {"k": [3]},
    "fact_order-unknown": {"fact_order": "random"},
    "fact_order-upper-case": {"fact_order": "RANK"},
    "fact_order-number": {"fact_order": 1},
    "fact_order-bool": {"fact_order": False},
    "recompute_tail-negative": {"recompute_tail": -1},
    "recompute_tail-bool": {"recompute_tail": True},
    "recompute_tail-float": {"recompute_tail": 1.5},
    "recompute_tail-string": {"recompute_tail": "2"},
}


@pytest.mark.parametrize("memory", INVALID_MEMORY.values(), ids=INVALID_MEMORY.keys())
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_engine_and_the_server_refuse_a_bad_memory_option_alike(
        server: ServerHandle, engine: MemoryEngine, model: str, memory: dict[str, Any],
        stream: bool) -> None:
    """The engine's message and param, with the option named as the request names it."""
    (name, value), = memory.items()
    with pytest.raises(InvalidInputError) as caught:
        engine.chat(ask("Hi"), memory=False, max_tokens=2, **{name: value})
    assert caught.value.param == name
    assert str(caught.value).startswith(f"{name}: ") and repr(value) in str(caught.value)
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, "messages": ask("Hi"), "max_tokens": 2, "stream": stream,
            "memory": memory})
    assert_openai_error(response, 400, "invalid_value")
    error = response.json()["error"]
    assert (error["message"], error["param"]) == (f"memory.{caught.value}", f"memory.{name}")


# What the server itself decides about ``memory``: its shape, its own bounds over the
# engine's rules (MAX_K), and ``mode``, whose "off" is the server's (the engine's
# memory=False). On the old code the bounds' messages lacked the value, and a bad mode
# read "memory.mode: Input should be 'kv' or 'text' (and 1 more problem(s))".
SERVER_MEMORY = {
    "k-above-the-servers-bound": ({"k": MAX_K + 1}, "memory.k",
                                  f"memory.k: Input should be less than or equal to {MAX_K}; "
                                  f"got {MAX_K + 1}"),
    "recompute_tail-above-the-servers-bound": (
        {"recompute_tail": MAX_K + 1}, "memory.recompute_tail",
        f"memory.recompute_tail: Input should be less than or equal to {MAX_K}; "
        f"got {MAX_K + 1}"),
    "mode-unknown": ({"mode": "telepathy"}, "memory.mode",
                     "memory.mode: Input should be 'kv', 'text' or 'off'"),
    "mode-null": ({"mode": None}, "memory.mode",
                  "memory.mode: Input should be 'kv', 'text' or 'off'"),
    "unknown-option": ({"k": 2, "colour": "red"}, "memory.colour",
                       "memory.colour: Extra inputs are not permitted"),
    "not-an-object": ("kv", "memory",
                      "memory: Input should be a valid dictionary or object to extract "
                      "fields from"),
}


@pytest.mark.parametrize(("memory", "param", "message"), SERVER_MEMORY.values(),
                         ids=SERVER_MEMORY.keys())
def test_the_server_refuses_what_only_it_decides_about_memory(
        server: ServerHandle, model: str, memory: Any, param: str, message: str) -> None:
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, "messages": ask("Hi"), "max_tokens": 2, "memory": memory})
    assert_openai_error(response, 400, "invalid_value")
    error = response.json()["error"]
    assert (error["message"], error["param"]) == (message, param)


def test_good_memory_options_are_answered(server: ServerHandle, model: str) -> None:
    """The bounds are inclusive, null is the engine's default, and every order and mode
    is taken."""
    with http(server) as client:
        for memory in ({"k": MAX_K, "recompute_tail": MAX_K}, {"k": None, "fact_order": None},
                       *({"fact_order": order} for order in FACT_ORDERS),
                       *({"mode": mode} for mode in ("kv", "text", "off"))):
            response = client.post("/chat/completions", json={
                "model": model, "messages": ask("Hi"), "max_tokens": 2, "memory": memory})
            assert response.status_code == 200, (memory, response.text)


def test_a_request_passes_each_checker_once(server: ServerHandle, model: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of the engine's checkers runs once per HTTP request: messages were checked twice
    by the engine (its call check and the prompt layout), and tools, tool_choice,
    response_format and the sampling options by the server's request schema too, which now
    only shows them (the refusals above are the engine's, word for word)."""
    counted: dict[str, int] = {}

    def counting(module: Any, name: str) -> None:
        checker = getattr(module, name)
        counted[name] = 0

        def count(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return checker(*args, **kwargs)

        monkeypatch.setattr(module, name, count)

    counting(inferscale_memory.conversation, "_message")
    counting(inferscale_memory.conversation, "check_tool_calls")
    for name in ("check_guided", "_tools", "_choice", "_response_format"):
        counting(inferscale_memory.tools.checks, name)
    counting(inferscale_memory.options, "check_options")
    messages = [*CALLED, {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, "messages": messages, "max_tokens": 2, "tools": [WEATHER],
            "tool_choice": "none", "parallel_tool_calls": False,
            "response_format": {"type": "text"}, "temperature": 0.5, "top_p": 0.9,
            "top_k": 5, "stop": ["\n\n"], "seed": 3, "memory": {"mode": "off"}})
    assert response.status_code == 200, response.text
    assert counted == {"_message": len(messages), "check_tool_calls": 1, "check_guided": 1,
                       "_tools": 1, "_choice": 1, "_response_format": 1, "check_options": 1}


def test_the_openapi_document_shows_the_engines_shapes(server: ServerHandle) -> None:
    """The request schema's constraints come from the engine's definitions, not copies."""
    with http(server) as client:
        document = client.get(f"{server.url}/openapi.json").json()
    shapes = document["components"]["schemas"]
    request = shapes["ChatCompletionRequest"]["properties"]
    assert shapes["ChatMessage"]["properties"]["role"]["enum"] == list(ROLES)
    assert shapes["FunctionParam"]["properties"]["name"]["pattern"] == TOOL_NAME.pattern
    assert shapes["ResponseFormat"]["properties"]["type"]["enum"] == list(RESPONSE_FORMATS)
    assert {"enum": list(TOOL_CHOICES), "type": "string"} in request["tool_choice"]["anyOf"]
    assert {"type": "number", "minimum": 0, "maximum": 2} in request["temperature"]["anyOf"]
    assert [part.get("maxItems") for part in request["stop"]["anyOf"]] == [None, MAX_STOPS, None]
    memory = shapes["MemoryOptions"]["properties"]
    assert {"type": "integer", "minimum": 1, "maximum": MAX_K} in memory["k"]["anyOf"]
    assert {"type": "integer", "minimum": 0, "maximum": MAX_K} in memory["recompute_tail"]["anyOf"]
    assert {"enum": list(FACT_ORDERS), "type": "string"} in memory["fact_order"]["anyOf"]

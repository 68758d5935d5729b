"""A chat is checked once, by the engine's checkers, whichever way it comes in (issue 32):
the server refuses an invalid chat with the engine's own error, and a request's messages
and schemas pass their checkers once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from server_helpers import ask, assert_openai_error, http

import inferscale_memory.conversation
import inferscale_memory.tools.checks
from inferscale_memory import InvalidInputError

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


# Chats the server's request schema accepts and one of the engine's checkers refuses.
INVALID_CHATS: list[dict[str, Any]] = [
    {"messages": [*ask("Hi"), {"role": "tool", "tool_call_id": "call_1", "content": "12"}]},
    {"messages": [*CALLED, {"role": "tool", "content": "12"}]},
    {"messages": [*ask("Hi"), {"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "f", "arguments": "not json"}}]}, *ask("And?")]},
    {"messages": ask("Hi") + [{"role": "assistant", "content": "Hello"}]},
    {"response_format": json_schema({"type": []})},
    {"response_format": json_schema({"type": "string", "pattern": "^(a+)+$"})},
    {"tools": [WEATHER, WEATHER]},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
]


@pytest.mark.parametrize("chat", INVALID_CHATS, ids=[
    "orphan-result", "no-tool-call-id", "arguments-not-json", "assistant-last",
    "admits-nothing", "nested-pattern", "same-tool-twice", "unknown-named-tool"])
def test_the_engine_and_the_server_refuse_an_invalid_chat_alike(
        server: ServerHandle, engine: MemoryEngine, model: str, chat: dict[str, Any]) -> None:
    options = {key: value for key, value in chat.items() if key != "messages"}
    with pytest.raises(InvalidInputError) as caught:
        engine.chat(chat["messages"] if "messages" in chat else ask("Hi"), max_tokens=2,
                    memory=False, **options)
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, "messages": ask("Hi"), "max_tokens": 2, **chat})
    assert_openai_error(response, 400)
    error = response.json()["error"]
    assert (error["message"], error["param"]) == (str(caught.value), caught.value.param)


def test_a_request_passes_each_checker_once(server: ServerHandle, model: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Schemas were checked by the server and again by the engine, and each message twice
    by the engine (its call check and the prompt layout)."""
    counted: dict[str, int] = {"message": 0, "schemas": 0}

    def counting(module: Any, name: str, key: str) -> None:
        checker = getattr(module, name)

        def count(*args: Any, **kwargs: Any) -> Any:
            counted[key] += 1
            return checker(*args, **kwargs)

        monkeypatch.setattr(module, name, count)

    counting(inferscale_memory.conversation, "_message", "message")
    counting(inferscale_memory.tools.checks, "check_guided", "schemas")
    messages = [*CALLED, {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, "messages": messages, "max_tokens": 2, "tools": [WEATHER],
            "tool_choice": "none", "memory": {"mode": "off"}})
    assert response.status_code == 200, response.text
    assert counted == {"message": len(messages), "schemas": 1}

"""Bad requests get OpenAI-style 4xx errors and the server keeps serving; metrics;
graceful shutdown."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import add_facts, ask, assert_openai_error, http

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

GOOD: dict[str, Any] = {"messages": ask("Hi"), "max_tokens": 2}


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A ``response_format`` asking for JSON valid against ``schema``."""
    return {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}


BAD_BODIES = [
    ({"max_tokens": "lots"}, "max_tokens"),
    ({"messages": "Hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, None),
    ({"messages": [{"role": "user", "content": 42}]}, None),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 9}, "temperature"),
    ({"stop": [1, 2]}, None),
    ({"seed": 10**30}, "seed"),
    ({"n": 2}, "n"),
    ({"memory": {"k": 0}}, "memory.k"),
    ({"memory": {"k": "many"}}, "memory.k"),
    ({"memory": {"k": -3}}, "memory.k"),
    ({"memory": {"mode": "telepathy"}}, "memory.mode"),
    ({"memory": {"k": 2, "colour": "red"}}, "memory.colour"),
    ({"user": ""}, None),
    ({"user": "x" * 500}, None),
    ({"messages": ask("Hi") + [{"role": "assistant", "content": "Hello"}]}, None),
    ({"max_tokens": 100_000}, None),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"stream": True, "logprobs": True}, "logprobs"),
    ({"logit_bias": {"42": 10}}, "logit_bias"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"presence_penalty": 3}, "presence_penalty"),
    # a schema that admits nothing, or that needs a document from elsewhere: no answer
    # can conform (it was answered with unconstrained JSON)
    ({"response_format": json_schema({"type": []})}, "response_format.json_schema.schema"),
    ({"response_format": json_schema({"type": "object", "properties": {
        "a": {"$ref": "https://example.com/a.json"}}})}, "response_format.json_schema.schema"),
    ({"response_format": json_schema({"$ref": "http://example.com/s.json#/x"})},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": []}}}}}]},
     "tools.0.function.parameters"),
    # a tool result that answers no earlier call of the assistant (OpenAI refuses it)
    ({"messages": [*ask("Hi"), {"role": "tool", "tool_call_id": "call_1", "content": "12"}]},
     "messages.1.tool_call_id"),
    ({"messages": [*ask("Hi"), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "12"}]},
     "messages.2.tool_call_id"),
]


@pytest.mark.parametrize(("change", "param"), BAD_BODIES,
                         ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_chat_requests_are_400(server: ServerHandle, model: str, change: dict[str, Any],
                                   param: str | None) -> None:
    with http(server) as client:
        response = client.post("/chat/completions", json={"model": model, **GOOD, **change})
    assert_openai_error(response, 400)
    if param is not None:
        assert response.json()["error"]["param"] == param


# Schemas that held the engine core for minutes (issue 30, item 2): refused before vLLM.
NESTED_PATTERN = {"type": "string", "pattern": "^(a+)+$"}
WIDE_SCHEMA = {"type": "object", "required": [f"field_{i:04d}" for i in range(8000)],
               "properties": {f"field_{i:04d}": {"type": "string"} for i in range(8000)}}


@pytest.mark.parametrize(("change", "param", "limit"), [
    ({"response_format": json_schema(NESTED_PATTERN)}, "response_format.json_schema.schema",
     "pattern_star_height"),
    ({"response_format": json_schema(WIDE_SCHEMA)}, "response_format.json_schema.schema",
     "schema_bytes"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": NESTED_PATTERN}}],
      "tool_choice": "required"}, "tools.0.function.parameters", "pattern_star_height"),
], ids=["nested-pattern", "8000-properties", "tool"])
def test_schemas_past_the_guided_decoding_limits_are_400(
        server: ServerHandle, model: str, change: dict[str, Any], param: str,
        limit: str) -> None:
    with http(server) as client:
        response = client.post("/chat/completions",
                               json={"model": model, **GOOD, "max_tokens": 48, **change})
    assert_openai_error(response, 400, "schema_too_complex")
    error = response.json()["error"]
    assert error["param"] == param
    assert f"schema_limits.{limit}" in error["message"], error


def test_malformed_requests_and_the_server_keeps_serving(server: ServerHandle,
                                                         model: str) -> None:
    json_header = {"Content-Type": "application/json"}
    with http(server) as client:
        assert_openai_error(client.post("/chat/completions", json={"model": "gpt-9", **GOOD}),
                            404, "model_not_found")
        assert_openai_error(client.post("/chat/completions", content=b'{"model": ',
                                        headers=json_header), 400, "invalid_json")
        assert_openai_error(client.post("/chat/completions", content=b"[1, 2, 3]",
                                        headers=json_header), 400)
        assert_openai_error(client.post("/chat/completions", content=b"\xff\xfe\x00",
                                        headers=json_header), 400)
        huge = {"model": model, "messages": ask("x" * (2 << 20))}
        assert_openai_error(client.post("/chat/completions", json=huge), 413,
                            "request_too_large")
        assert_openai_error(client.post("/memories", json={"user_id": "srv-bad",
                                                           "text": "y" * (3 << 20)}), 413)
        assert_openai_error(client.post("/memories", json={"user_id": "srv-bad", "text": ""}),
                            400)
        assert_openai_error(client.post("/memories", json={"user_id": "srv-bad", "text": 7}),
                            400)
        assert_openai_error(client.post("/memories", json={"user_id": "srv-bad",
                                                           "text": "z " * 2000}), 400)
        assert_openai_error(client.post("/memories/search", json={"user_id": "srv-bad",
                                                                  "query": "a", "k": 0}), 400)
        assert_openai_error(client.get("/nowhere"), 404)
        assert_openai_error(client.delete("/models"), 405)
        good = client.post("/chat/completions", json={"model": model, **GOOD})
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"]
    with http(server, key=None) as client:
        assert client.get(f"{server.url}/health").json()["status"] == "ok"


def test_metrics(server: ServerHandle, model: str, engine: MemoryEngine) -> None:
    add_facts(server, "srv-metrics", "Quinn's bike is red.")
    with http(server) as client:
        for mode in ("kv", "text"):
            body = {"model": model, "messages": ask("What colour is Quinn's bike?"),
                    "max_tokens": 4, "user": "srv-metrics", "memory": {"mode": mode}}
            assert client.post("/chat/completions", json=body).status_code == 200
        client.post("/chat/completions", json={"model": "nope", **GOOD})
        text = client.get(f"{server.url}/metrics").text
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    assert samples[("inferscale_chat_ttft_seconds_count", (("mode", "kv"),))] >= 1
    assert samples[("inferscale_chat_ttft_seconds_count", (("mode", "text"),))] >= 1
    assert samples[("inferscale_chat_injected_tokens_total", ())] > 0
    assert samples[("inferscale_recomputed_facts_total", ())] >= 0
    assert samples[("inferscale_facts", ())] >= 1
    assert samples[("inferscale_kv_pool_bytes", ())] > 0
    # The engine's pool counters, read at the scrape (the engine is shared: later values
    # can only be larger).
    stats = engine.kv_stats
    assert 1 <= samples[("inferscale_kv_injected_facts_total", ())] <= stats.injected
    assert 1 <= samples[("inferscale_kv_captured_facts_total", ())] <= stats.captured
    assert samples[("inferscale_kv_missed_facts_total", ())] <= stats.recomputed
    assert samples[("inferscale_kv_pool_tokens", ())] > 0
    assert samples[("inferscale_kv_pool_budget_tokens", ())] == stats.budget_tokens
    assert ("inferscale_kv_host_tokens", ()) in samples
    assert ("inferscale_kv_host_budget_tokens", ()) not in samples  # no host tier here
    for status, at_least in (("200", 2), ("404", 1)):
        labels = (("method", "POST"), ("route", "/v1/chat/completions"), ("status", status))
        assert samples[("inferscale_http_requests_total", labels)] >= at_least


def test_graceful_shutdown_finishes_in_flight_requests(engine: MemoryEngine,
                                                       model: str) -> None:
    from inferscale_memory.server import create_app, start_server

    handle = start_server(create_app(engine), engine)  # no API keys: open on localhost
    body = {"model": model, "messages": ask("Tell me a story."), "max_tokens": 32,
            "stream": True, "memory": {"mode": "off"}}
    events = []
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", f"{handle.url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:  # wait for the first piece of the answer: now it is in flight
            events.append(line)
            if '"content":"' in line and '"content":""' not in line:
                break
        handle.request_stop()
        events.extend(lines)
    handle.stop(timeout=120)
    assert not handle.running
    data = [line.removeprefix("data: ") for line in events if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{handle.url}/health", timeout=5)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
], ids=["self", "mutual"])
def test_a_schema_the_engine_cannot_compile_is_400(server: ServerHandle, model: str,
                                                   schema: dict[str, Any], stream: bool) -> None:
    """vLLM ends such a request as an error; it was answered 200 with empty content and
    ``finish_reason: "error"`` (not an OpenAI value)."""
    with http(server) as client:
        response = client.post("/chat/completions", json={
            "model": model, **GOOD, "stream": stream, "response_format": json_schema(schema)})
        assert_openai_error(response, 400)
        assert response.json()["error"]["param"] == "response_format.json_schema.schema"
        assert client.post("/chat/completions", json={"model": model, **GOOD}).status_code == 200

"""Tool schemas, choices, output formats and parsing, without an engine.

The parser of ``tool_choice="auto"`` is vLLM's own (``hermes``), the templates are the
embedded SmolLM2's (no tools) and Qwen2.5's (``tests/tool_model.py``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tool_model import QWEN25_TEMPLATE

from inferscale_memory import InvalidInputError
from inferscale_memory.layout import PromptBuilder, validate_messages
from inferscale_memory.tools import (
    TOOL_MODELS,
    check_tool_request,
    refuse_without_template,
    template_parser,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                          "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}


@pytest.fixture(scope="module")
def smol() -> Any:
    from transformers import AutoTokenizer

    from inferscale_memory.config import MemoryConfig
    from inferscale_memory.models import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model(None, MemoryConfig.load().cache_dir)))


@pytest.fixture(scope="module")
def qwen(smol: Any) -> Any:
    import copy

    tokenizer = copy.deepcopy(smol)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.chat_template = QWEN25_TEMPLATE
    return tokenizer


def test_parsers_are_chosen_from_the_template(smol: Any, qwen: Any) -> None:
    assert template_parser(qwen) == "hermes"
    assert template_parser(smol) is None  # SmolLM2's template ignores tools
    message = str(refuse_without_template("SmolLM2-135M-Instruct"))
    assert "SmolLM2-135M-Instruct" in message and all(m in message for m in TOOL_MODELS)


def test_auto_calls_are_read_by_vllms_hermes_parser(qwen: Any) -> None:
    request = check_tool_request([WEATHER], "auto", parser="hermes")
    assert request is not None and request.structured_outputs() is None
    text = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}' \
           '\n</tool_call>'
    content, calls = request.parse(text, qwen)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather",
                                                                    {"city": "Berlin"})]
    assert request.parse("No call here.", qwen) == ("No call here.", [])


def test_required_and_named_use_guided_decoding(qwen: Any) -> None:
    required = check_tool_request([WEATHER], "required", parallel_tool_calls=False)
    assert required is not None
    schema = required.structured_outputs()["json"]  # type: ignore[index]
    assert schema["type"] == "array" and schema["minItems"] == schema["maxItems"] == 1
    content, calls = required.parse('[{"name": "get_weather", "parameters": {"city": "Rome"}}]',
                                    qwen)
    assert content is None and json.loads(calls[0].arguments) == {"city": "Rome"}
    assert required.parse('[{"name": "get_weather", "param', qwen)[1] == []  # cut short
    named = check_tool_request([WEATHER], {"type": "function",
                                           "function": {"name": "get_weather"}})
    assert named is not None
    assert named.structured_outputs() == {"json": WEATHER["function"]["parameters"]}


def test_response_formats() -> None:
    assert check_tool_request(response_format={"type": "json_object"}).structured_outputs() \
        == {"json_object": True}  # type: ignore[union-attr]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    assert check_tool_request(response_format=fmt).structured_outputs()["json"] == schema  # type: ignore[index]
    assert check_tool_request(response_format={"type": "text"}).structured_outputs() is None  # type: ignore[union-attr]


@pytest.mark.parametrize("kwargs, match", [
    (dict(tools=[{"type": "function", "function": {"name": "no spaces"}}]), "function name"),
    (dict(tools=[WEATHER, WEATHER]), "unique"),
    (dict(tools="x"), "list"),
    (dict(tool_choice="required"), "needs tools"),
    (dict(tools=[WEATHER], tool_choice="always"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
     "not among tools"),
    (dict(tools=[WEATHER], parallel_tool_calls="yes"), "parallel_tool_calls"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(response_format={"type": "json_schema"}), "json_schema"),
    (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
     "constrain the same answer"),
])
def test_bad_requests_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        check_tool_request(**kwargs)


def test_tool_messages_render_after_the_memory_span(qwen: Any) -> None:
    builder = PromptBuilder(qwen)
    messages = [{"role": "user", "content": "Weather where Caroline lives?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    plain = builder.build(messages[:1], [("f1", "Caroline lives in Berlin.")])
    layout = builder.build(messages, [("f1", "Caroline lives in Berlin.")], [WEATHER])
    # Same header and fact tokens: the fact's captured KV still fits; tools follow it.
    assert layout.token_ids[:layout.memory_end] == plain.token_ids[:plain.memory_end]
    footer = qwen.decode(layout.token_ids[layout.memory_end:])
    assert footer.index('"name": "get_weather"') < footer.index("<tool_call>\n{\"name\"")
    assert '{"name": "get_weather", "arguments": {"city": "Berlin"}}' in footer
    assert "<tool_response>\n12 C\n</tool_response>" in footer


@pytest.mark.parametrize("message, match", [
    ({"role": "tool", "content": "x"}, "tool_call_id"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, "tool call"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "f", "arguments": "not json"}}]}, "tool call"),
])
def test_bad_tool_messages_are_refused(message: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        validate_messages([message])

"""Tool schemas, choices, output formats and parsing, without an engine.

The parser of ``tool_choice="auto"`` is vLLM's own (``hermes``), the templates are the
embedded SmolLM2's (no tools: our own tool prompt) and Qwen2.5's (``tests/tool_model.py``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tool_model import QWEN25_TEMPLATE

from inferscale_memory import InvalidInputError
from inferscale_memory.conversation import Conversation
from inferscale_memory.layout import PromptBuilder
from inferscale_memory.tools import (
    OWN_TOOL_PARSER,
    TOOL_MODELS,
    check_tool_request,
    format_parser,
    refuse_without_template,
    template_renders_tools,
    tool_prompt,
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
    assert PromptBuilder(qwen).tool_parser == "hermes"
    # SmolLM2's template ignores tools: our own prompt, whose calls hermes reads.
    assert PromptBuilder(smol).tool_parser == OWN_TOOL_PARSER == "hermes"
    message = str(refuse_without_template("SmolLM2-135M-Instruct"))  # tool_parser None
    assert "SmolLM2-135M-Instruct" in message and all(m in message for m in TOOL_MODELS)


def test_a_template_without_tools_gets_our_own_tool_prompt_after_the_facts(smol: Any) -> None:
    builder = PromptBuilder(smol)
    assert not builder.renders_tools
    messages = [{"role": "user", "content": "Weather where Caroline lives?"}]
    plain = builder.build(messages, [("f1", "Caroline lives in Berlin.")])
    layout = builder.build(messages, [("f1", "Caroline lives in Berlin.")], [WEATHER])
    assert layout.token_ids[:layout.memory_end] == plain.token_ids[:plain.memory_end]
    footer = smol.decode(layout.token_ids[layout.memory_end:])
    system, question = footer.split("<|im_end|>")[:2]
    assert system.endswith(tool_prompt([WEATHER]))  # the end of the system message
    assert '<tools>[{"name": "get_weather", "parameters": {"type": "object"' in system
    assert '<tool_call>{"name": "tool_name", "arguments": {"argument": "value"}}</tool_call>' \
        in system
    assert "Weather where Caroline lives?" in question
    assert builder.build(messages, [], None).token_ids == builder.build(messages, []).token_ids


# Like Llama 3.1's and 3.2's templates: tools change the system header (they write
# "Environment: ipython" before the system message) and go into the first user turn.
HEADER_TOOLS_TEMPLATE = """\
{{- '<|im_start|>system\\n' }}{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in rest %}
{{- '<|im_start|>' + message['role'] + '\\n' }}
{%- if tools and loop.first %}{{- tools | tojson }}{%- endif %}
{{- message['content'] + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def test_a_template_that_puts_tools_before_the_system_message_gets_our_tool_prompt(
        smol: Any) -> None:
    import copy

    tokenizer = copy.deepcopy(smol)
    tokenizer.chat_template = HEADER_TOOLS_TEMPLATE
    assert template_renders_tools(tokenizer)  # it renders tools, and changes the header:
    assert "Environment: ipython" in tokenizer.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        tools=[WEATHER], tokenize=False)
    builder = PromptBuilder(tokenizer)
    assert not builder.renders_tools  # so they are ours, after the facts, read by hermes
    assert (format_parser(tokenizer.chat_template), builder.tool_parser) == (
        "llama3_json", "hermes")
    messages = [{"role": "user", "content": "Weather where Caroline lives?"}]
    plain = builder.build(messages, [("f1", "Caroline lives in Berlin.")])
    layout = builder.build(messages, [("f1", "Caroline lives in Berlin.")], [WEATHER])
    assert layout.token_ids[:layout.memory_end] == plain.token_ids[:plain.memory_end]
    footer = tokenizer.decode(layout.token_ids[layout.memory_end:])
    assert "Environment: ipython" not in tokenizer.decode(layout.token_ids)
    assert footer.split("<|im_end|>")[0].endswith(tool_prompt([WEATHER]))


def test_tool_turns_become_text_turns_for_a_template_without_tools(smol: Any) -> None:
    builder = PromptBuilder(smol)
    second = {**CALL, "id": "call_2", "function": {"name": "get_weather",
                                                   "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather in Berlin and Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL, second]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "15 C"}]
    footer = smol.decode(builder.build(messages, [], [WEATHER]).token_ids)
    assert ('<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": '
            '{"city": "Berlin"}}</tool_call>\n<tool_call>{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}</tool_call><|im_end|>') in footer
    assert ("<|im_start|>user\n<tool_response>\n12 C\n</tool_response>\n"
            "<tool_response>\n15 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            ) in footer
    assert "<|im_start|>tool" not in footer


def test_our_tool_prompts_calls_are_read_by_hermes_one_or_a_list(smol: Any) -> None:
    request = check_tool_request([WEATHER], "auto", parser=PromptBuilder(smol).tool_parser)
    assert request is not None
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Berlin"}}</tool_call>'
    listed = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Berlin"}}, ' \
             '{"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>'
    assert [json.loads(c.arguments) for c in request.parse(one, smol)[1]] == [{"city": "Berlin"}]
    content, calls = request.parse(listed, smol)  # SmolLM2's SFT format
    assert content is None
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Berlin", "Rome"]
    assert request.parse("It is sunny.", smol) == ("It is sunny.", [])


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


TIME = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(response_format={"type": "text"}), None),
    (dict(tools=[WEATHER, TIME], tool_choice="required"), "tools"),
    (dict(tools=[WEATHER, TIME], tool_choice={"type": "function",
                                              "function": {"name": "get_time"}}),
     "tools.1.function.parameters"),
    (dict(tools=[WEATHER, TIME]), None),  # auto: vLLM's parser reads the calls, no grammar
    (dict(tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"}),
     "response_format"),
])
def test_the_guided_parameter_is_the_one_whose_schema_guides(kwargs: dict[str, Any],
                                                             param: str | None) -> None:
    """What a SchemaError about the grammar vLLM failed on names (issue 30, item 4)."""
    request = check_tool_request(**kwargs)
    assert request is not None
    assert request.guided_param == param
    assert (request.structured_outputs() is None) == (param is None)


@pytest.mark.parametrize("kwargs, match, param", [
    (dict(tools=[{"type": "function", "function": {"name": "no spaces"}}]), "should match",
     "tools.0.function.name"),
    (dict(tools=[WEATHER, WEATHER]), "unique", "tools.1.function.name"),
    (dict(tools="x"), "list", "tools"),
    (dict(tools=[{"type": "function"}]), "Field required", "tools.0.function"),
    (dict(tools=[{**WEATHER, "function": {**WEATHER["function"], "description": 5}}]),
     "valid string", "tools.0.function.description"),
    (dict(tool_choice="required"), "needs tools", "tool_choice"),
    (dict(tools=[WEATHER], tool_choice="always"), "tool_choice", "tool_choice"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
     "not among tools", "tool_choice.function.name"),
    (dict(tools=[WEATHER], parallel_tool_calls="yes"), "parallel_tool_calls",
     "parallel_tool_calls"),
    (dict(response_format={"type": "xml"}), "response_format", "response_format.type"),
    (dict(response_format={"type": "json_schema"}), "json_schema",
     "response_format.json_schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "n" * 65}}),
     "at most 64", "response_format.json_schema.name"),
    (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
     "constrain the same answer", "response_format"),
    # what guided decoding may be asked (inferscale_memory.schema_limits; issue 30)
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": {
        "type": "string", "pattern": "^(a+)+$"}}}), r"schema_limits\.pattern_star_height",
     "response_format.json_schema.schema"),
    (dict(tools=[{"type": "function", "function": {"name": f"t{i}"}} for i in range(129)]),
     r"129 tools, over the limit of 128 \(schema_limits\.tools\)", "tools"),
    (dict(tools=[{**WEATHER, "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"unit": {"enum": list(range(5000))}}}}}]),
     r"tools\.0\.function\.parameters: an enum of 5000 values", "tools.0.function.parameters"),
])
def test_bad_requests_are_refused(kwargs: dict[str, Any], match: str, param: str) -> None:
    """Each refusal names the parameter at fault, as the server's 400 does (issue 32)."""
    with pytest.raises(InvalidInputError, match=match) as refused:
        check_tool_request(**kwargs)
    assert refused.value.param == param


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


@pytest.mark.parametrize("message, param", [
    ({"role": "tool", "content": "x"}, "messages.0.tool_call_id"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
     "messages.0.tool_calls.0.function"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "f", "arguments": "not json"}}]},
     "messages.0.tool_calls.0.function.arguments"),
    ({"role": "user", "content": "Hi", "tool_calls": "x"}, "messages.0.tool_calls"),
])
def test_bad_tool_messages_are_refused(message: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        Conversation.check([message])
    assert refused.value.param == param
    assert refused.value.param.split(".")[-1] in str(refused.value)


# The public names of inferscale_memory/tools.py before it was split by noun (issue 32):
# the engine, the server, the adapters and users import them from inferscale_memory.tools.
TOOLS_NAMES = {
    "OWN_TOOL_PARSER", "PROBE_TOOL", "RESPONSE_FORMATS", "TEMPLATE_PARSERS", "TOOL_CHOICES",
    "TOOL_MODELS", "TOOL_NAME", "TOOL_PROMPT", "ToolCall", "ToolCallDelta", "ToolRequest",
    "ToolStream", "call_text", "check_tool_calls", "check_tool_request", "format_parser",
    "new_call_id", "own_template_messages", "refuse_without_template", "split_call_lists",
    "template_messages", "template_renders_tools", "tool_prompt",
}


def test_every_name_of_the_tools_module_is_still_imported_from_it() -> None:
    import inferscale_memory.tools as tools

    assert set(tools.__all__) == TOOLS_NAMES
    missing = [name for name in TOOLS_NAMES if not hasattr(tools, name)]
    assert not missing, missing

"""Tool calls and structured output of :meth:`MemoryEngine.chat`, in OpenAI's shapes.

The memory span is untouched: the tools go into the model's own chat template (after the
facts, in the footer), so the facts are injected as KV exactly as without tools. What
vLLM already has does the rest:

- ``tool_choice="auto"``: the model writes its calls in its own format and one of vLLM's
  tool parsers reads them (``hermes`` for Qwen2.5's ``<tool_call>`` blocks,
  ``llama3_json`` for Llama 3.x); the parser is chosen from the chat template and can be
  overridden (:attr:`MemoryEngine.tool_parser`).
- ``tool_choice="required"`` or a named function, and ``response_format``
  (``json_object``, ``json_schema``): vLLM's structured outputs (guided decoding) constrain
  the answer to JSON of the schema, as vLLM's own server does: a list of
  ``{"name", "parameters"}`` for ``required``, the function's arguments for a named one.
  Guided decoding works on any model, even one without a tool template.

A model whose chat template ignores ``tools`` (the embedded SmolLM2-135M), or renders them
before the system message (Llama 3.1 and 3.2 write "Environment: ipython" into the system
header, so the facts would follow another header than the one they were captured after),
gets our own minimal tool prompt instead (:func:`tool_prompt`, hermes-style, in the system
part after the facts): the tool schemas as a JSON list in ``<tools></tools>``, and calls answered as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, which vLLM's ``hermes``
parser reads. Tool results and the assistant's earlier calls become text of user and
assistant turns (:func:`own_template_messages`). Setting :attr:`MemoryEngine.tool_parser`
to ``None`` refuses tools on such a model instead.

Example:
    >>> reply = engine.chat(messages, user_id="caroline", tools=[WEATHER],  # doctest: +SKIP
    ...                     tool_choice="required")
    >>> reply.tool_calls[0].name, json.loads(reply.tool_calls[0].arguments)  # doctest: +SKIP
    ('get_weather', {'city': 'Berlin'})
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.schema_limits import (
    RESPONSE_PARAM,
    TOOLS_PARAM,
    SchemaLimits,
    check_guided,
)

TOOL_CHOICES = ("auto", "none", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Parsers of vLLM (``--tool-call-parser`` names), by a marker of the chat template.
TEMPLATE_PARSERS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"),
                    ("ipython", "llama3_json"))
TOOL_MODELS = ("Qwen2.5-Instruct (its chat template, hermes)",
               "any other (our own tool prompt, hermes)")
PROBE_TOOL = {"type": "function", "function": {"name": "inferscale_probe", "parameters": {}}}
OWN_TOOL_PARSER = "hermes"  # reads the calls of our own tool prompt
# Our own tool prompt, for a chat template that ignores tools. SmolLM2's SFT data (APIGen)
# lists the functions as JSON in <tools></tools> and calls them in <tool_call> tags.
TOOL_PROMPT = (
    "You can call these tools:\n<tools>{tools}</tools>\n\n"
    "To call a tool, answer with one line per call and nothing else:\n"
    '<tool_call>{{"name": "tool_name", "arguments": {{"argument": "value"}}}}</tool_call>\n'
    "If no tool is needed, answer the user directly.")
_CALL_BLOCK = re.compile(r"<tool_call>\s*(\[.*?\])\s*</tool_call>", re.DOTALL)
_EMPTY_OBJECT = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: ``arguments`` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI shape: ``{"id", "type": "function", "function": {...}}``."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of tool call ``index``: the first one has ``id`` and ``name``,
    the ``arguments`` pieces joined are the call's arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ToolRequest:
    """The checked ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
    ``response_format`` of one chat call."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    choice: str | dict[str, Any] = "none"  # "auto", "none", "required" or a named function
    parallel: bool = True
    response_format: dict[str, Any] | None = None
    parser: str | None = None  # vLLM tool parser of "auto"

    @property
    def calls_tools(self) -> bool:
        """Whether the answer may hold tool calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def named(self) -> str | None:
        """The forced function's name (``tool_choice={"type": "function", ...}``)."""
        return self.choice["function"]["name"] if isinstance(self.choice, dict) else None

    def structured_outputs(self) -> dict[str, Any] | None:
        """Keyword arguments of vLLM's ``StructuredOutputsParams``, or ``None`` (the JSON
        is compact: the runtime starts vLLM with ``disable_any_whitespace``)."""
        if self.calls_tools and self.named is not None:
            return {"json": self._parameters(self.named)}
        if self.calls_tools and self.choice == "required":
            schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {
                "type": "object", "anyOf": [_call_schema(t["function"]) for t in self.tools]}}
            if not self.parallel:
                schema["maxItems"] = 1
            return {"json": schema}
        if self.response_format is None or self.response_format["type"] == "text":
            return None
        if self.response_format["type"] == "json_object":
            return {"json_object": True}
        return {"json": self.response_format["json_schema"].get("schema", _EMPTY_OBJECT)}

    @property
    def guided_param(self) -> str | None:
        """The request parameter whose schema guides decoding, as an error about that schema
        names it (``None``: :meth:`structured_outputs` guides nothing)."""
        if self.calls_tools and self.named is not None:
            return f"tools.{self._index(self.named)}.function.parameters"
        if self.calls_tools and self.choice == "required":
            return TOOLS_PARAM
        if self.response_format is None or self.response_format["type"] == "text":
            return None
        return "response_format" if self.response_format["type"] == "json_object" \
            else RESPONSE_PARAM

    def _parameters(self, name: str) -> dict[str, Any]:
        return self.tools[self._index(name)]["function"].get("parameters") or _EMPTY_OBJECT

    def _index(self, name: str) -> int:
        for i, tool in enumerate(self.tools):
            if tool["function"]["name"] == name:
                return i
        raise AssertionError(name)  # check_tool_request made sure it is there

    def parse(self, text: str, tokenizer: Any) -> tuple[str | None, list[ToolCall]]:
        """Split a finished answer into its content and its tool calls."""
        if not self.calls_tools:
            return text, []
        if self.named is not None:
            return (None, [ToolCall(new_call_id(), self.named, text.strip())]) \
                if _is_object(text) else (text, [])
        if self.choice == "required":
            return _parse_required(text)
        return _parse_with_vllm(self, text, tokenizer)


def check_tool_request(tools: Any = None, tool_choice: Any = None,
                       parallel_tool_calls: Any = None, response_format: Any = None,
                       parser: str | None = None, limits: SchemaLimits | None = None
                       ) -> ToolRequest | None:
    """Check the tool and output options of one call (``None``: none given), and what
    their schemas ask of guided decoding against ``limits`` (``None``: the defaults; the
    engine passes its config's ``schema_limits``).

    Raises:
        InvalidInputError: A malformed tool, an unknown ``tool_choice``, a named function
            that is not among ``tools``, a bad ``response_format``, or a ``response_format``
            other than text together with tools that may be called.
        SchemaLimitError: Schemas or tools past ``limits``
            (:func:`~inferscale_memory.schema_limits.check_guided`).
    """
    if tools is None and tool_choice is None and parallel_tool_calls is None \
            and response_format is None:
        return None
    checked = _tools(tools)
    choice = _choice(tool_choice, checked)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidInputError(
            f"parallel_tool_calls must be true or false; got {parallel_tool_calls!r:.50}")
    request = ToolRequest(checked, choice, parallel_tool_calls is not False,
                          _response_format(response_format), parser)
    fmt = request.response_format
    check_guided(limits or SchemaLimits(),
                 fmt["json_schema"].get("schema") if fmt and fmt["type"] == "json_schema" else None,
                 [t["function"].get("parameters") for t in checked])
    if request.calls_tools and request.structured_outputs() is not None \
            and request.response_format not in (None, {"type": "text"}):
        raise InvalidInputError("response_format and tools constrain the same answer; "
                                "send one, or tool_choice='none'")
    return request


def format_parser(chat_template: str) -> str:
    """vLLM's tool parser for the call format a chat template that renders tools asks for
    (whether the prompt uses the template's tools or our own :func:`tool_prompt` is
    :attr:`~inferscale_memory.layout.PromptBuilder.tool_parser`'s decision)."""
    for marker, parser in TEMPLATE_PARSERS:
        if marker in chat_template:
            return parser
    return "hermes"  # vLLM's generic JSON-in-tags format


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders ``tools`` at all."""
    probe = [{"role": "user", "content": "probe"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=[PROBE_TOOL], tokenize=False,
                                                   add_generation_prompt=True)
    except Exception:  # a template that fails on tools has none
        return False
    return "inferscale_probe" in with_tools


def refuse_without_template(model: str) -> InvalidInputError:
    """The error for tools sent to an engine whose ``tool_parser`` was set to ``None``."""
    return InvalidInputError(
        f"tools are off for the model {model} (the engine's tool_parser is None); set it to "
        f"a vLLM tool parser, or use a model whose chat template renders tools "
        f"({', '.join(TOOL_MODELS)}). response_format (json_object, json_schema) works on "
        "any model")


def tool_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """Our own tool prompt (:data:`TOOL_PROMPT`) for ``tools``: the functions' ``name``,
    ``description`` and ``parameters`` as one JSON list."""
    functions = [{key: t["function"][key] for key in ("name", "description", "parameters")
                  if key in t["function"]} for t in tools]
    return TOOL_PROMPT.format(tools=json.dumps(functions, ensure_ascii=False))


def call_text(name: str, arguments: str) -> str:
    """One call in our own tool prompt's format (``arguments``: JSON text of an object)."""
    return json.dumps({"name": name, "arguments": json.loads(arguments)},
                      ensure_ascii=False).join(("<tool_call>", "</tool_call>"))


def own_template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checked messages (:func:`~inferscale_memory.layout.validate_messages`) for a chat
    template that knows no tools: an assistant's ``tool_calls`` become its text (one
    :func:`call_text` line each), and a run of ``tool`` results becomes one user turn of
    ``<tool_response>`` blocks."""
    out: list[dict[str, Any]] = []
    after_tool = False
    for message in messages:
        if message.get("tool_calls"):
            lines = [call_text(c["function"]["name"], c["function"]["arguments"])
                     for c in message["tool_calls"]]
            content = "\n".join([message["content"], *lines] if message["content"] else lines)
            out.append({"role": "assistant", "content": content})
        elif message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if after_tool:
                out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{block}"}
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append(message)
        after_tool = message["role"] == "tool"
    return out


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolStream:
    """Turns the streamed text of an answer into content and tool-call deltas.

    A named function's arguments stream as they are generated (the answer *is* the
    arguments object). Calls of ``required`` and ``auto`` are parsed when the answer is
    finished and arrive as whole calls (one delta each), with any content before them.
    """

    def __init__(self, request: ToolRequest) -> None:
        self.request = request
        self._named_id = new_call_id() if request.named is not None else None
        self._started = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Content to send now and tool-call deltas, for a new piece of ``text``."""
        if not self.request.calls_tools:
            return text, []
        if self.request.named is None or not text:
            return "", []
        first = not self._started
        self._started = True
        return "", [ToolCallDelta(0, self._named_id if first else None,
                                  self.request.named if first else None, text)]

    def finish(self, content: str | None, calls: list[ToolCall]
               ) -> tuple[str, list[ToolCallDelta]]:
        """What is left to send once the answer is parsed into ``content`` and ``calls``."""
        if not self.request.calls_tools or self.request.named is not None:
            return "", []
        return content or "", [ToolCallDelta(i, call.id, call.name, call.arguments)
                               for i, call in enumerate(calls)]

    @property
    def named_call_id(self) -> str | None:
        """The id streamed for the named function's call (the result's call uses it)."""
        return self._named_id


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates take them: a tool call's ``arguments`` as
    an object, not OpenAI's JSON text (as vLLM's own server hands them over)."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**call, "function": {**call["function"],
                                           "arguments": json.loads(call["function"]["arguments"])}}
                     for call in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` in OpenAI's shape, checked and copied."""
    if not isinstance(calls, list) or not calls:
        raise InvalidInputError(f"{where}: tool_calls must be a non-empty list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(call.get("id"), str)
                or call.get("type", "function") != "function"
                or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)
                or not _is_object(function["arguments"])):
            raise InvalidInputError(
                f"{where}: each tool call must be {{'id', 'type': 'function', 'function': "
                "{'name', 'arguments': a JSON object as text}}")
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": function["name"], "arguments": function["arguments"]}})
    return out


# -- checks ------------------------------------------------------------------------------

def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list | tuple):
        raise InvalidInputError("tools must be a list of tools")
    out, names = [], set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" \
                or not isinstance(function, dict):
            raise InvalidInputError(f"tool {i} must be {{'type': 'function', 'function': "
                                    "{'name', 'description', 'parameters'}}")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name) or name in names:
            raise InvalidInputError(f"tool {i}: the function name must be 1-64 letters, "
                                    f"digits, '_' or '-', and unique; got {name!r:.70}")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidInputError(f"tool {i}: parameters must be a JSON schema object")
        if not isinstance(function.get("description", ""), str):
            raise InvalidInputError(f"tool {i}: description must be a string")
        names.add(name)
        kept = {key: function[key] for key in ("name", "description", "parameters", "strict")
                if function.get(key) is not None}
        out.append({"type": "function", "function": kept})
    return out


def _choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise InvalidInputError(f"tool_choice must be one of {TOOL_CHOICES} or a named "
                                    f"function; got {choice!r:.50}")
        if choice != "none" and not tools:
            raise InvalidInputError(f"tool_choice {choice!r} needs tools")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" \
            or not isinstance(name, str):
        raise InvalidInputError("a named tool_choice must be {'type': 'function', "
                                "'function': {'name': ...}}")
    if name not in {t["function"]["name"] for t in tools}:
        raise InvalidInputError(f"tool_choice names {name!r:.70}, which is not among tools")
    return {"type": "function", "function": {"name": name}}


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise InvalidInputError(f"response_format must be {{'type': one of {RESPONSE_FORMATS}}}"
                                f"; got {value!r:.80}")
    if kind != "json_schema":
        return {"type": kind}
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
            or not isinstance(spec.get("schema", {}), dict):
        raise InvalidInputError("response_format json_schema must be {'type': 'json_schema', "
                                "'json_schema': {'name', 'schema': a JSON schema object}}")
    return {"type": kind, "json_schema": dict(spec)}


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {"properties": {"name": {"type": "string", "enum": [function["name"]]},
                           "parameters": function.get("parameters") or _EMPTY_OBJECT},
            "required": ["name", "parameters"]}


# -- parsing -----------------------------------------------------------------------------

def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _parse_required(text: str) -> tuple[str | None, list[ToolCall]]:
    """The answer of guided decoding for ``required``: a list of ``{name, parameters}``."""
    try:
        items = json.loads(text)
    except ValueError:  # cut short (max_tokens): not a call
        return text, []
    if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str)
            and isinstance(i.get("parameters"), dict) for i in items):
        return text, []
    return None, [ToolCall(new_call_id(), i["name"], json.dumps(i["parameters"],
                                                                ensure_ascii=False))
                  for i in items]


def _parse_with_vllm(request: ToolRequest, text: str, tokenizer: Any
                     ) -> tuple[str | None, list[ToolCall]]:
    """``auto``: vLLM's tool parser of the model reads the calls out of the text
    (:func:`inferscale_memory.driver.frontend.extract_tool_calls`)."""
    from inferscale_memory.driver.frontend import extract_tool_calls

    assert request.parser is not None
    if request.parser == "hermes":
        text = split_call_lists(text)
    content, found = extract_tool_calls(request.parser, request.tools, text, tokenizer)
    return content, [ToolCall(new_call_id(), name, arguments) for name, arguments in found]


def split_call_lists(text: str) -> str:
    """A ``<tool_call>`` block holding a JSON list of calls (the form of SmolLM2's SFT
    data) as one block per call, the form vLLM's ``hermes`` parser reads."""
    def split(match: re.Match[str]) -> str:
        try:
            calls = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        return "".join(json.dumps(c, ensure_ascii=False).join(("<tool_call>", "</tool_call>"))
                       for c in calls)

    return _CALL_BLOCK.sub(split, text)

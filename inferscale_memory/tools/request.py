"""The checked tool options of one chat call: what they ask of guided decoding, and how
the finished answer is read back into content and calls."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from inferscale_memory.driver.tool_parsing import read_tool_calls
from inferscale_memory.schema_limits import RESPONSE_PARAM, TOOLS_PARAM
from inferscale_memory.tools.calls import ToolCall, is_json_object, new_call_id

EMPTY_OBJECT = {"type": "object", "properties": {}}  # the schema of a tool without parameters


@dataclass(frozen=True)
class ToolRequest:
    """The checked ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
    ``response_format`` of one chat call
    (:func:`~inferscale_memory.tools.checks.check_tool_request` makes it)."""

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
        """Keyword arguments of vLLM's ``StructuredOutputsParams``, or ``None``. The runtime
        sends a ``json`` or ``json_object`` one as its grammar, JSON with ``", "`` and
        ``": "`` and no other whitespace (:mod:`inferscale_memory.driver.guided_json`)."""
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
        return {"json": self.response_format["json_schema"].get("schema", EMPTY_OBJECT)}

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
        return self.tools[self._index(name)]["function"].get("parameters") or EMPTY_OBJECT

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
                if is_json_object(text) else (text, [])
        if self.choice == "required":
            return _parse_required(text)
        # auto: vLLM's tool parser of the model reads the calls out of the text
        assert self.parser is not None
        content, found = read_tool_calls(self.parser, self.tools, text, tokenizer)
        return content, [ToolCall(new_call_id(), name, arguments) for name, arguments in found]


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {"properties": {"name": {"type": "string", "enum": [function["name"]]},
                           "parameters": function.get("parameters") or EMPTY_OBJECT},
            "required": ["name", "parameters"]}


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

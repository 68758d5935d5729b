"""What the server refuses in a chat request before the engine sees it: JSON schemas that
no answer can conform to, and tool results that answer no call.

A schema reaches vLLM's guided decoding (``response_format``, a tool's ``parameters``).
Two kinds were answered 200 with unconstrained JSON, as if it conformed: a ``type`` that
admits nothing (``[]``, or no JSON type), and a ``$ref`` to another document (the grammar
compiler fetches nothing). Only the schema's own keywords are read: ``enum``, ``const``,
``default`` and ``examples`` hold data, and ``properties`` maps names to schemas.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from inferscale_memory.server.errors import APIError
from inferscale_memory.server.schemas import ChatCompletionRequest, ChatMessage

JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "not", "if",
              "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
               "dependencies")


def check_request(body: ChatCompletionRequest) -> None:
    """Refuse ``body`` if a schema of it admits nothing or refers to another document, or
    a tool result answers no earlier tool call.

    Raises:
        APIError: 400, naming the parameter at fault.
    """
    rf = body.response_format
    if rf is not None and rf.json_schema is not None and rf.json_schema.json_schema:
        check_schema(rf.json_schema.json_schema, "response_format.json_schema.schema")
    for i, tool in enumerate(body.tools or []):
        if tool.function.parameters:
            check_schema(tool.function.parameters, f"tools.{i}.function.parameters")
    check_tool_results(body.messages)


def check_schema(schema: dict[str, Any], param: str) -> None:
    """Refuse a schema with an empty or unknown ``type`` or a ``$ref`` outside itself.

    Raises:
        APIError: 400 naming ``param``.
    """
    for where, node in _subschemas(schema):
        problem = _type_problem(node.get("type")) if "type" in node else None
        ref = node.get("$ref")
        if problem is None and "$ref" in node and not (isinstance(ref, str)
                                                        and ref.startswith("#")):
            problem = (f"$ref {ref!r} points outside the schema; only references within it "
                       "(\"#/$defs/...\") are supported")
        if problem is not None:
            raise APIError(400, f"{param}: {problem} (at {where or 'the root'})",
                           param=param, code="invalid_schema")


def check_tool_results(messages: Sequence[ChatMessage]) -> None:
    """Refuse a ``tool`` message whose ``tool_call_id`` names no call of an earlier
    assistant message (OpenAI refuses it too).

    Raises:
        APIError: 400 naming ``messages.<i>.tool_call_id``.
    """
    called: set[str] = set()
    for i, message in enumerate(messages):
        if message.role == "assistant":
            called.update(call.id for call in message.tool_calls or [])
        elif message.role == "tool" and message.tool_call_id not in called:
            raise APIError(400, f"messages[{i}]: a tool message must answer a tool call of an "
                           f"earlier assistant message; tool_call_id "
                           f"{message.tool_call_id!r} answers none",
                           param=f"messages.{i}.tool_call_id", code="invalid_value")


def _type_problem(value: Any) -> str | None:
    types = value if isinstance(value, list) else [value]
    if not types:
        return "type [] admits no value"
    unknown = [t for t in types if not isinstance(t, str) or t not in JSON_TYPES]
    if unknown:
        return f"type {unknown[0]!r} is not a JSON type (one of {sorted(JSON_TYPES)})"
    return None


def _subschemas(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema within ``schema`` (itself included) with its path; iterative, so a
    deeply nested schema cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict):
            continue  # true/false schemas; a malformed one is vLLM's to refuse
        yield where, node
        for key in ONE_SCHEMA:
            if isinstance(node.get(key), dict):
                stack.append((f"{where}/{key}", node[key]))
        for key in SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((f"{where}/{key}/{i}", item) for i, item in enumerate(node[key]))
        for key in SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((f"{where}/{key}/{name}", item)
                             for name, item in node[key].items())

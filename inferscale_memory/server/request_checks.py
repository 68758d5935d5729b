"""What the server refuses in a chat request before the engine sees it: JSON schemas that
no answer can conform to or that ask too much of guided decoding, and tool results that
answer no call.

A schema reaches vLLM's guided decoding (``response_format``, a tool's ``parameters``).
Two kinds were answered 200 with unconstrained JSON, as if it conformed: a ``type`` that
admits nothing (``[]``, or no JSON type), and a ``$ref`` to another document (the grammar
compiler fetches nothing). Only the schema's own keywords are read: ``enum``, ``const``,
``default`` and ``examples`` hold data, and ``properties`` maps names to schemas (the walk
is :func:`~inferscale_memory.schema_limits.subschemas`). The engine's bounds on schemas
(:func:`~inferscale_memory.schema_limits.check_guided`, which the engine applies too) are
checked here first, so that a refusal names its parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferscale_memory.schema_limits import (
    RESPONSE_PARAM,
    SchemaLimitError,
    SchemaLimits,
    check_guided,
    subschemas,
)
from inferscale_memory.server.errors import APIError, schema_error
from inferscale_memory.server.schemas import ChatCompletionRequest, ChatMessage

JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


def check_request(body: ChatCompletionRequest, limits: SchemaLimits | None = None) -> None:
    """Refuse ``body`` if its schemas or tools go past ``limits`` (``None``: the defaults;
    the server passes its engine's ``schema_limits``), a schema of it admits nothing or
    refers to another document, or a tool result answers no earlier tool call.

    Raises:
        APIError: 400, naming the parameter at fault.
    """
    rf = body.response_format
    response_schema = rf.json_schema.json_schema if rf is not None and rf.type == "json_schema" \
        and rf.json_schema is not None else None
    tool_parameters = [tool.function.parameters for tool in body.tools or []]
    try:
        check_guided(limits or SchemaLimits(), response_schema, tool_parameters)
    except SchemaLimitError as exc:
        raise schema_error(exc) from None
    if response_schema:
        check_schema(response_schema, RESPONSE_PARAM)
    for i, parameters in enumerate(tool_parameters):
        if parameters:
            check_schema(parameters, f"tools.{i}.function.parameters")
    check_tool_results(body.messages)


def check_schema(schema: dict[str, Any], param: str) -> None:
    """Refuse a schema with an empty or unknown ``type`` or a ``$ref`` outside itself.

    Raises:
        APIError: 400 naming ``param``.
    """
    for where, _, node in subschemas(schema):
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

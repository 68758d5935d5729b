"""The tool and output options of one chat call (OpenAI's ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format``), checked into a
:class:`~inferscale_memory.tools.request.ToolRequest`."""

from __future__ import annotations

import re
from typing import Any

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.schema_limits import SchemaLimits, check_guided
from inferscale_memory.tools.request import ToolRequest

TOOL_CHOICES = ("auto", "none", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


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

"""The tool and output options of one chat call (OpenAI's ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format``), checked into a
:class:`~inferscale_memory.tools.request.ToolRequest`: their shapes against
:mod:`.shapes`, then the rules across them. Each error names its ``param``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import check, invalid
from inferscale_memory.schema_limits import SchemaLimits, check_guided
from inferscale_memory.tools.request import ToolRequest
from inferscale_memory.tools.shapes import ResponseFormat, ToolChoice, ToolParam

# A list (or, from Python, a tuple) of tools; each tool's shape stays strict.
_TOOLS = TypeAdapter(Annotated[list[ToolParam], Field(strict=False)])
_CHOICE = TypeAdapter(ToolChoice)
_FORMAT = TypeAdapter(ResponseFormat)


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
    check(bool | None, parallel_tool_calls, "parallel_tool_calls")
    request = ToolRequest(checked, choice, parallel_tool_calls is not False,
                          _response_format(response_format), parser)
    fmt = request.response_format
    check_guided(limits or SchemaLimits(),
                 fmt["json_schema"].get("schema") if fmt and fmt["type"] == "json_schema" else None,
                 [t["function"].get("parameters") for t in checked])
    if request.calls_tools and request.structured_outputs() is not None \
            and request.response_format not in (None, {"type": "text"}):
        raise InvalidInputError("response_format and tools constrain the same answer; "
                                "send one, or tool_choice='none'", "response_format")
    return request


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    try:
        shaped = _TOOLS.validate_python(tools)
    except ValidationError as exc:
        raise invalid(exc, "tools") from None
    names: set[str] = set()
    for i, tool in enumerate(shaped):
        if tool.function.name in names:
            raise InvalidInputError(f"tools.{i}.function.name: each function's name must be "
                                    f"unique; {tool.function.name!r} is taken",
                                    f"tools.{i}.function.name")
        names.add(tool.function.name)
    return [tool.model_dump(exclude_none=True) for tool in shaped]


def _choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if choice is None:
        return "auto" if tools else "none"
    try:
        shaped = _CHOICE.validate_python(choice)
    except ValidationError as exc:
        raise invalid(exc, "tool_choice") from None
    if isinstance(shaped, str):
        if shaped != "none" and not tools:
            raise InvalidInputError(f"tool_choice {shaped!r} needs tools", "tool_choice")
        return shaped
    name = shaped.function.name
    if name not in {t["function"]["name"] for t in tools}:
        raise InvalidInputError(f"tool_choice names {name!r:.70}, which is not among tools",
                                "tool_choice.function.name")
    return shaped.model_dump()


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        shaped = _FORMAT.validate_python(value)
    except ValidationError as exc:
        raise invalid(exc, "response_format") from None
    if shaped.type != "json_schema":
        return {"type": shaped.type}
    if shaped.json_schema is None:
        raise InvalidInputError("response_format json_schema must be {'type': 'json_schema', "
                                "'json_schema': {'name', 'schema': a JSON schema object}}",
                                "response_format.json_schema")
    return {"type": shaped.type,
            "json_schema": shaped.json_schema.model_dump(by_alias=True, exclude_none=True)}

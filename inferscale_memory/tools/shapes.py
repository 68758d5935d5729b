"""The shapes of OpenAI's tool options, as pydantic models: the one definition of what a
tool, a ``tool_choice``, a ``response_format`` and an assistant's tool call look like.

The engine checks a call's values against them (:mod:`.checks`, :mod:`.calls`), and the
server's request schema shows them in its OpenAPI document without checking them again
(:mod:`inferscale_memory.server.schemas`), so ``engine.chat`` and the server refuse a
malformed tool with the same error. Rules across values (unique names, a named function
among the tools, arguments that are a JSON object) are the checkers'.

Example:
    >>> ToolParam.model_validate({"type": "function", "function": {"name": "now"}}).function
    FunctionParam(name='now', description=None, parameters=None, strict=None)
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
ToolChoiceMode = Literal["auto", "none", "required"]
ResponseFormatType = Literal["text", "json_object", "json_schema"]
TOOL_CHOICES: tuple[str, ...] = get_args(ToolChoiceMode)
RESPONSE_FORMATS: tuple[str, ...] = get_args(ResponseFormatType)
MAX_FORMAT_NAME = 64  # OpenAI's longest json_schema name


class FunctionCallParam(BaseModel):
    """The function of a tool call: ``arguments`` is a JSON object as text."""

    model_config = ConfigDict(extra="ignore", strict=True)

    name: str
    arguments: str


class ToolCallParam(BaseModel):
    """A tool call of an earlier assistant message."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class FunctionParam(BaseModel):
    """A function the model may call: its ``parameters`` are a JSON schema."""

    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(pattern=TOOL_NAME.pattern)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(BaseModel):
    """A tool: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function"]
    function: FunctionParam


class NamedFunction(BaseModel):
    model_config = ConfigDict(strict=True)

    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming the function the model must call."""

    model_config = ConfigDict(strict=True)

    type: Literal["function"]
    function: NamedFunction


ToolChoice = ToolChoiceMode | NamedToolChoice


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the answer is JSON valid against ``schema``."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = Field(max_length=MAX_FORMAT_NAME)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``text``, ``json_object`` or ``json_schema`` (guided decoding)."""

    model_config = ConfigDict(strict=True)

    type: ResponseFormatType
    json_schema: JsonSchemaFormat | None = None

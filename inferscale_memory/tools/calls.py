"""The tool calls a model made, in OpenAI's shapes: whole, streamed, and as an assistant
message sends them back."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import invalid
from inferscale_memory.tools.shapes import ToolCallParam

_CALLS = TypeAdapter(list[ToolCallParam])


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


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def is_json_object(text: str) -> bool:
    """Whether ``text`` is the JSON text of an object (a call's arguments)."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` in OpenAI's shape
    (:class:`~inferscale_memory.tools.shapes.ToolCallParam`), checked and copied; ``where``
    is the parameter that holds them (``"messages.1.tool_calls"``), which errors name.

    Raises:
        InvalidInputError: Not a list of tool calls, or arguments that are no JSON object.
    """
    try:
        shaped = _CALLS.validate_python(calls)
    except ValidationError as exc:
        raise invalid(exc, where) from None
    for j, call in enumerate(shaped):
        if not is_json_object(call.function.arguments):
            param = f"{where}.{j}.function.arguments"
            raise InvalidInputError(f"{param}: a tool call's arguments must be a JSON object "
                                    f"as text; got {call.function.arguments!r:.80}", param)
    return [call.model_dump() for call in shaped]

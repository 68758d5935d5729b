"""The tool calls a model made, in OpenAI's shapes: whole, streamed, and as an assistant
message sends them back."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from inferscale_memory.errors import InvalidInputError


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
                or not is_json_object(function["arguments"])):
            raise InvalidInputError(
                f"{where}: each tool call must be {{'id', 'type': 'function', 'function': "
                "{'name', 'arguments': a JSON object as text}}")
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": function["name"], "arguments": function["arguments"]}})
    return out

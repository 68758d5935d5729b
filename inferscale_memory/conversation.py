"""A chat's messages, checked once: :class:`Conversation`.

:meth:`Conversation.check` owns the rules of a message list in OpenAI's shape
(:class:`ChatMessage`: roles, text content or text parts, an assistant's tool calls, and
the tool results that answer them). The engine
checks each call's messages through it once (:func:`~inferscale_memory.options.check_chat`);
what takes a :class:`Conversation` (the prompt layout) trusts it, as it would a parsed
value. The server's requests reach it through the engine (its OpenAPI document shows
:class:`ChatMessage` and checks nothing), so an error names the same ``param`` whichever
way a chat came in.

Example:
    >>> chat = Conversation.check([{"role": "user", "content": "Hi"}])
    >>> Conversation.check(chat) is chat, len(chat)
    (True, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, SkipValidation, ValidationError

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import invalid, unicode_text
from inferscale_memory.tools import check_tool_calls
from inferscale_memory.tools.shapes import ToolCallParam

Role = Literal["system", "developer", "user", "assistant", "tool"]  # developer: system
ROLES: tuple[str, ...] = get_args(Role)


class TextPart(BaseModel):
    """A text content part (the only kind supported)."""

    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message in OpenAI's shape (``developer`` is taken as ``system``; text parts
    are joined). An ``assistant`` message may carry ``tool_calls`` (``content`` may then
    be null), and a ``tool`` message carries the result of one (``tool_call_id``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    # checked by check_tool_calls, the one checker of a message's calls
    tool_calls: SkipValidation[list[ToolCallParam] | None] = None
    tool_call_id: str | None = None

    def text(self) -> str | None:
        """The message's text (text parts joined), or ``None`` without content."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class Conversation(tuple[dict[str, Any], ...]):
    """Messages that passed :meth:`check`, as plain dicts: ``system``, ``user`` and
    ``assistant`` messages with text ``content``, an assistant's ``tool_calls`` (its
    ``content`` then ``""`` where none was given), and ``tool`` messages answering an
    earlier call (``tool_call_id``)."""

    __slots__ = ()

    @classmethod
    def check(cls, messages: Any) -> Conversation:
        """``messages`` checked (a :class:`Conversation` is returned as it is).

        Raises:
            InvalidInputError: Naming the message at fault (``param``
                ``messages.<i>...``).
        """
        if isinstance(messages, Conversation):
            return messages
        if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
            raise InvalidInputError("messages must be a list of {'role', 'content'} dicts",
                                    "messages")
        called: set[str] = set()
        out = []
        for i, message in enumerate(messages):
            out.append(_message(message, i, called))
            called.update(call["id"] for call in out[-1].get("tool_calls", ()))
        return cls(out)


def _message(message: Any, i: int, called: set[str]) -> dict[str, Any]:
    """Message ``i`` checked; a tool result must answer one of the ``called`` ids."""
    try:
        shaped = ChatMessage.model_validate(message)
    except ValidationError as exc:
        raise invalid(exc, f"messages.{i}") from None
    role = "system" if shaped.role == "developer" else shaped.role
    content = shaped.text()
    # any role's calls are checked (the shape says so); an assistant's are kept
    calls = check_tool_calls(shaped.tool_calls, f"messages.{i}.tool_calls") \
        if shaped.tool_calls not in (None, []) else []
    calls = calls if role == "assistant" else []
    if content is None and not calls:
        raise InvalidInputError(f"message {i}: content must be a string"
                                + (" or null" if role == "assistant" and shaped.tool_calls
                                   else ""), f"messages.{i}.content")
    if content is not None:
        unicode_text(content, f"message {i}: content")
    if calls:
        return {"role": role, "content": content or "", "tool_calls": calls}
    if role != "tool":
        return {"role": role, "content": content}
    call_id = shaped.tool_call_id
    if call_id is None:
        raise InvalidInputError(f"message {i}: a tool message needs tool_call_id",
                                f"messages.{i}.tool_call_id")
    if call_id not in called:  # OpenAI refuses it too
        raise InvalidInputError(
            f"messages[{i}]: a tool message must answer a tool call of an earlier assistant "
            f"message; tool_call_id {call_id!r} answers none", f"messages.{i}.tool_call_id")
    return {"role": role, "content": content, "tool_call_id": call_id}

"""A chat's messages, checked once: :class:`Conversation`.

:meth:`Conversation.check` owns the rules of a message list in OpenAI's shape (roles, text
content, an assistant's tool calls and the tool results that answer them). The engine
checks each call's messages through it once (:func:`~inferscale_memory.options.check_chat`);
what takes a :class:`Conversation` (the prompt layout) trusts it, as it would a parsed
value. The server's requests reach it through the engine, so an error names the same
``param`` whichever way a chat came in.

Example:
    >>> chat = Conversation.check([{"role": "user", "content": "Hi"}])
    >>> Conversation.check(chat) is chat, len(chat)
    (True, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import unicode_text
from inferscale_memory.tools import check_tool_calls

ROLES = {"system", "user", "assistant", "tool"}


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
    if not isinstance(message, dict):
        raise InvalidInputError(f"message {i} must be a dict", f"messages.{i}")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidInputError(f"message {i}: role must be one of {sorted(ROLES)}",
                                f"messages.{i}.role")
    calls = role == "assistant" and message.get("tool_calls")
    if not isinstance(content, str) and not (calls and content is None):
        raise InvalidInputError(f"message {i}: content must be a string"
                                + (" or null" if calls else ""), f"messages.{i}.content")
    if content is not None:
        unicode_text(content, f"message {i}: content")
    if calls:
        return {"role": role, "content": content or "",
                "tool_calls": check_tool_calls(message["tool_calls"], f"message {i}")}
    if role != "tool":
        return {"role": role, "content": content}
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise InvalidInputError(f"message {i}: a tool message needs tool_call_id",
                                f"messages.{i}.tool_call_id")
    if call_id not in called:  # OpenAI refuses it too
        raise InvalidInputError(
            f"messages[{i}]: a tool message must answer a tool call of an earlier assistant "
            f"message; tool_call_id {call_id!r} answers none", f"messages.{i}.tool_call_id")
    return {"role": role, "content": content, "tool_call_id": call_id}

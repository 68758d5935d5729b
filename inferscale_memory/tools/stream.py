"""The streamed answer of a chat call with tools: content and tool-call deltas."""

from __future__ import annotations

from inferscale_memory.tools.calls import ToolCall, ToolCallDelta, new_call_id
from inferscale_memory.tools.request import ToolRequest


class ToolStream:
    """Turns the streamed text of an answer into content and tool-call deltas.

    A named function's arguments stream as they are generated (the answer *is* the
    arguments object). Calls of ``required`` and ``auto`` are parsed when the answer is
    finished and arrive as whole calls (one delta each), with any content before them.
    """

    def __init__(self, request: ToolRequest) -> None:
        self.request = request
        self._named_id = new_call_id() if request.named is not None else None
        self._started = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Content to send now and tool-call deltas, for a new piece of ``text``."""
        if not self.request.calls_tools:
            return text, []
        if self.request.named is None or not text:
            return "", []
        first = not self._started
        self._started = True
        return "", [ToolCallDelta(0, self._named_id if first else None,
                                  self.request.named if first else None, text)]

    def finish(self, content: str | None, calls: list[ToolCall]
               ) -> tuple[str, list[ToolCallDelta]]:
        """What is left to send once the answer is parsed into ``content`` and ``calls``."""
        if not self.request.calls_tools or self.request.named is not None:
            return "", []
        return content or "", [ToolCallDelta(i, call.id, call.name, call.arguments)
                               for i, call in enumerate(calls)]

    @property
    def named_call_id(self) -> str | None:
        """The id streamed for the named function's call (the result's call uses it)."""
        return self._named_id

"""Our tool prompt's tags, kept out of the answers users see.

A model may echo the tags of our tool prompt (:data:`~inferscale_memory.tools.TOOL_PROMPT`,
and of hermes templates) in its answer: SmolLM2 repeats a tool result it was shown as
``<tool_response>\\n12 C and rain in Berlin``. The adapters and the server show an answer's
text through :func:`shown` (a whole answer) or a :class:`MarkupFilter` (a stream): the tags
go, the text between them stays, and a tag alone on its line goes with its line break.
Tool calls the engine parsed are not text and are untouched.

Example:
    >>> strip_markup("<tool_response>\\n12 C and rain in Berlin")
    '12 C and rain in Berlin'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator

from inferscale_memory.results import ChatChunk, ChatResult

MARKUP_TAGS = ("<tools>", "</tools>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>")
_TAG = "(?:" + "|".join(map(re.escape, MARKUP_TAGS)) + ")"
_MARKUP = re.compile(rf"(?:(?<=\n)|^){_TAG}\n|{_TAG}")
# A stream holds back an end that may still grow into one of these.
_FORMS = tuple(f"{tag}\n" for tag in MARKUP_TAGS)


def strip_markup(text: str) -> str:
    """``text`` without the tags of :data:`MARKUP_TAGS`."""
    return _MARKUP.sub("", text)


def shown(result: ChatResult) -> ChatResult:
    """``result`` with its text as a user should see it (:func:`strip_markup`)."""
    text = strip_markup(result.text)
    return result if text == result.text else dataclasses.replace(result, text=text)


class MarkupFilter:
    """:func:`strip_markup` for a streamed answer: a piece that may begin a tag waits for
    the next one, so the pieces joined read as the whole answer stripped.

    Example:
        >>> pieces = MarkupFilter()
        >>> pieces.feed("<tool_"), pieces.feed("response>\\n12 C"), pieces.flush()
        ('', '12 C', '')
    """

    def __init__(self) -> None:
        self._held = ""  # the end of the text so far that may still grow into a tag
        self._before = ""  # the last character passed on (whether a tag starts a line)

    def feed(self, piece: str) -> str:
        """What of the answer so far can be shown, after ``piece``."""
        text = self._held + piece
        cut = _unfinished(text)
        self._held = text[cut:]
        return self._strip(text[:cut])

    def flush(self) -> str:
        """The rest, once the answer is finished."""
        text, self._held = self._held, ""
        return self._strip(text)

    def chunk(self, piece: ChatChunk) -> ChatChunk | None:
        """``piece`` of an engine's stream as shown (``None``: nothing to show yet); the
        last one's result is :func:`shown`."""
        if piece.result is None:
            text = self.feed(piece.text)
            return ChatChunk(text, None, piece.tool_calls) if text or piece.tool_calls else None
        return ChatChunk(self.feed(piece.text) + self.flush(), shown(piece.result),
                         piece.tool_calls)

    def _strip(self, text: str) -> str:
        stripped = strip_markup(self._before + text)[len(self._before):]
        self._before = text[-1:] or self._before
        return stripped


def shown_stream(pieces: Iterator[ChatChunk]) -> Iterator[ChatChunk]:
    """An engine's :meth:`~inferscale_memory.MemoryEngine.stream_chat` as shown; closing
    it closes ``pieces`` (the engine aborts the request)."""
    markup = MarkupFilter()
    try:
        for piece in pieces:
            if (chunk := markup.chunk(piece)) is not None:
                yield chunk
    finally:
        if isinstance(pieces, Generator):
            pieces.close()


async def ashown_stream(pieces: AsyncIterator[ChatChunk]) -> AsyncIterator[ChatChunk]:
    """An engine's :meth:`~inferscale_memory.MemoryEngine.astream_chat` as shown; closing
    it closes ``pieces`` (the engine aborts the request)."""
    markup = MarkupFilter()
    try:
        async for piece in pieces:
            if (chunk := markup.chunk(piece)) is not None:
                yield chunk
    finally:
        if isinstance(pieces, AsyncGenerator):
            await pieces.aclose()


def _unfinished(text: str) -> int:
    """Where the end of ``text`` that may still grow into markup starts: a tag begun, or
    a tag that may take the line break after it."""
    longest = max(map(len, _FORMS))
    return next((start for start in range(max(0, len(text) - longest), len(text))
                 if any(form.startswith(text[start:]) and form != text[start:]
                        for form in _FORMS)), len(text))

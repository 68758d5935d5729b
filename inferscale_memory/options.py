"""Checks of the per-request generation options of :meth:`MemoryEngine.chat`.

Every option is checked here, before vLLM sees it: vLLM's engine core decodes requests
in a thread of its own, and a value of the wrong type there (``seed="x"``,
``temperature=True`` with vLLM 0.32) stops that thread, after which no request is ever
answered again. The types are those of :mod:`inferscale_memory.fields`, which the server's
request schema uses too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import (
    Logprobs,
    MaxTokens,
    Penalty,
    Seed,
    Stop,
    Temperature,
    TopK,
    TopP,
    describe,
)

DEFAULT_MAX_LOGPROBS = 20  # vLLM's default max_logprobs


class ChatOptions(BaseModel):
    """The generation options of one chat call, as vLLM and OpenAI take them; strict (no
    ``"1"`` for ``1``, no ``True`` for a number). ``None`` means the default."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    logprobs: Logprobs | None = None
    ignore_eos: bool | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None


OPTIONS = tuple(ChatOptions.model_fields)


def check_options(options: dict[str, Any], *, default_max_tokens: int,
                  max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> dict[str, Any]:
    """Check the options of one chat call and return them with defaults filled in.

    Args:
        options: Any of ``max_tokens``, ``temperature``, ``stop``, ``seed``, ``logprobs``,
            ``ignore_eos``, ``top_p`` (in (0, 1]), ``top_k`` (>= 0; 0: every token),
            ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]), as vLLM and
            OpenAI take them; ``None`` means the default.
        default_max_tokens: ``max_tokens`` when it is absent.
        max_logprobs: The engine's largest ``logprobs``.

    Returns:
        A new dict with ``max_tokens`` and ``temperature`` always set (ints and a float),
        ``stop`` as a list, and the other options given.

    Raises:
        InvalidInputError: An unknown option or a value of the wrong type or range.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise InvalidInputError(f"unknown options {sorted(unknown)}; known: {list(OPTIONS)}")
    try:
        given = ChatOptions.model_validate(options).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise InvalidInputError(describe(exc)) from None
    if given.get("logprobs", 0) > max_logprobs:
        raise InvalidInputError(
            f"logprobs: at most {max_logprobs} (the engine's max_logprobs); "
            f"got {given['logprobs']}")
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    return {"max_tokens": default_max_tokens, "temperature": 0.0, **given}

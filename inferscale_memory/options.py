"""Checks of one :meth:`MemoryEngine.chat` call: its conversation, memory and generation
options (:func:`check_chat`), and facts handed in (:func:`check_given_facts`).

Every option is checked here, before vLLM sees it: vLLM's engine core decodes requests
in a thread of its own, and a value of the wrong type there (``seed="x"``,
``temperature=True`` with vLLM 0.32) stops that thread, after which no request is ever
answered again. The types are those of :mod:`inferscale_memory.fields`; the server's
request schema shows them in its OpenAPI document and leaves the checks to the engine, so
an HTTP request and ``engine.chat`` are refused with the same message and ``param``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from inferscale_memory.conversation import Conversation
from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import (
    FactCount,
    FactOrder,
    Logprobs,
    MaxTokens,
    Mode,
    Penalty,
    RecomputeTail,
    Seed,
    Stop,
    Temperature,
    TopK,
    TopP,
    UnicodeText,
    check,
    invalid,
)
from inferscale_memory.schema_limits import SchemaLimits
from inferscale_memory.store import Fact, ScoredFact
from inferscale_memory.tools import ToolRequest, check_tool_request, refuse_without_template

if TYPE_CHECKING:
    from inferscale_memory.config import MemoryConfig

DEFAULT_MAX_LOGPROBS = 20  # vLLM's default max_logprobs


class ChatOptions(BaseModel):
    """The generation options of one chat call, as vLLM and OpenAI take them; strict (no
    ``"1"`` for ``1``, no ``True`` for a number). ``None`` means the default."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None  # OpenAI's newer name; wins over max_tokens
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
        options: Any of ``max_tokens`` (or OpenAI's newer ``max_completion_tokens``, which
            wins where both are given), ``temperature``, ``stop``, ``seed``, ``logprobs``,
            ``ignore_eos``, ``top_p`` (in (0, 1]), ``top_k`` (>= 0; 0: every token),
            ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]), as vLLM and
            OpenAI take them; ``None`` means the default.
        default_max_tokens: ``max_tokens`` when it is absent.
        max_logprobs: The engine's largest ``logprobs``.

    Returns:
        A new dict with ``max_tokens`` and ``temperature`` always set (ints and a float),
        ``stop`` as a list, and the other options given.

    Raises:
        InvalidInputError: An unknown option or a value of the wrong type or range; its
            ``param`` names the option (``"stop.1"``).
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidInputError(f"unknown options {unknown}; known: {list(OPTIONS)}",
                                unknown[0])
    try:
        given = ChatOptions.model_validate(options).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise invalid(exc) from None
    if given.get("logprobs", 0) > max_logprobs:
        raise InvalidInputError(
            f"logprobs: at most {max_logprobs} (the engine's max_logprobs); "
            f"got {given['logprobs']}", "logprobs")
    if "max_completion_tokens" in given:
        given["max_tokens"] = given.pop("max_completion_tokens")
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    return {"max_tokens": default_max_tokens, "temperature": 0.0, **given}


@dataclass(frozen=True)
class ChatRequest:
    """One chat call, checked: its conversation and what shapes its answer."""

    conversation: Conversation
    k: int
    max_tokens: int
    fact_order: str
    recompute_tail: int
    tooling: ToolRequest | None
    sampling: dict[str, Any]  # vLLM's sampling options (not max_tokens), defaults filled in


def check_chat(config: MemoryConfig, messages: Any, *, k: int | None, mode: str,
               memory: Any, fact_order: str | None, recompute_tail: int | None,
               tool_parser: str | None, model_name: str, tools: Any = None,
               tool_choice: Any = None, parallel_tool_calls: Any = None,
               response_format: Any = None, **options: Any) -> ChatRequest:
    """Check one chat call against the engine's ``config`` (``None``: the config's value).

    Raises:
        InvalidInputError: A malformed conversation (the last message must be the user's,
            or tool results), a bad ``k``, ``mode``, ``memory``, quality option or
            generation option, or tools when the engine's ``tool_parser`` is ``None``.
    """
    conversation = Conversation.check(messages)
    if not conversation or conversation[-1]["role"] not in ("user", "tool") \
            or not any(m["role"] == "user" for m in conversation):
        raise InvalidInputError("the last message must be the user's (or tool results)",
                                "messages")
    check(Mode, mode, "mode")
    if not isinstance(memory, bool):
        raise InvalidInputError("memory must be true or false", "memory")
    sampling = check_options(
        options, default_max_tokens=config.max_tokens,
        max_logprobs=config.engine_args.get("max_logprobs", DEFAULT_MAX_LOGPROBS))
    tooling = check_tool_request(tools, tool_choice, parallel_tool_calls, response_format,
                                 tool_parser, SchemaLimits(**config.schema_limits))
    uses_tools = (tooling is not None and tooling.calls_tools) or any(
        m["role"] == "tool" or m.get("tool_calls") for m in conversation)
    if uses_tools and tool_parser is None:
        raise refuse_without_template(model_name)
    if tooling is not None:
        sampling.update(structured_outputs=tooling.structured_outputs(),
                        skip_special_tokens=not (tooling.calls_tools
                                                 and tooling.choice == "auto"))
    return ChatRequest(
        conversation=conversation,
        k=check(FactCount, config.k if k is None else k, "k"),
        max_tokens=sampling.pop("max_tokens"),
        fact_order=check(FactOrder, config.fact_order if fact_order is None else fact_order,
                         "fact_order"),
        recompute_tail=check(RecomputeTail, config.recompute_tail if recompute_tail is None
                             else recompute_tail, "recompute_tail"),
        tooling=tooling,
        sampling=sampling,
    )


def check_given_facts(facts: Sequence[Fact | ScoredFact],
                      user_id: str | None) -> list[ScoredFact]:
    """Facts handed to an answer (``facts=``) as scored facts; they must be ``user_id``'s.

    Raises:
        InvalidInputError: Not :class:`Fact` objects of ``user_id``, or a bad text.
    """
    scored = [f if isinstance(f, ScoredFact) else ScoredFact(f, 0.0) for f in facts]
    if any(not isinstance(s.fact, Fact) or s.fact.user_id != user_id for s in scored):
        raise InvalidInputError("facts must be Fact objects of the same user_id")
    for s in scored:
        check(UnicodeText, s.fact.text, "a fact's text")
    return scored

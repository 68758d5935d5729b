"""Prompt layout: ``header | fact_1 ... fact_k | footer`` as token ids, with the spans.

The text path and the KV path send the *same* token ids; they differ only in how the
memory span's KV is obtained. Each fact is tokenized on its own (``"- text\\n"``), so its
token ids, and therefore its captured KV, do not depend on its neighbours. The header is
the part of the chat template before the facts: identical for every user, captured once
and injected like a fact.

Example:
    >>> builder = PromptBuilder(tokenizer)                      # doctest: +SKIP
    >>> layout = builder.build([{"role": "user", "content": "Hi"}], [("f1", "Likes tea.")])
    >>> layout.fact_spans                                       # doctest: +SKIP
    [('f1', 31, 37)]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from inferscale_memory.conversation import Conversation
from inferscale_memory.errors import InvalidInputError
from inferscale_memory.tools import (
    OWN_TOOL_PARSER,
    PROBE_TOOL,
    format_parser,
    own_template_messages,
    template_messages,
    template_renders_tools,
    tool_prompt,
)

if TYPE_CHECKING:
    from inferscale_memory.store import Fact, ScoredFact

PREAMBLE = (
    "You are a helpful assistant with a long-term memory. "
    "These facts about the user are known:\n"
)
POSTAMBLE = "Use the facts when they help to answer."
SENTINEL = "\u2063INFERSCALE_MEMORY\u2063"
LAYOUT_VERSION = "1"
# Capture prompts are padded to at least this many tokens: vLLM's CPU GEMMs pick their
# kernel by the number of tokens in a step, and a short prompt's KV then differs in the
# last bits from the same tokens inside a normal-sized prompt. Padding after the captured
# span cannot change its KV (attention is causal).
MIN_CAPTURE_TOKENS = 64
NO_MESSAGES = Conversation(())


@dataclass(frozen=True)
class PromptLayout:
    """One prompt: its token ids and where the header and each fact sit."""

    token_ids: list[int]
    header_end: int  # header is [0, header_end)
    fact_spans: list[tuple[str, int, int]]  # (fact id, start, end), in prompt order
    layout_id: str

    @property
    def memory_end(self) -> int:
        return self.fact_spans[-1][2] if self.fact_spans else self.header_end

    @property
    def memory_tokens(self) -> int:
        return self.memory_end - self.header_end


class PromptBuilder:
    """Renders conversations with the model's chat template around the memory span."""

    def __init__(self, tokenizer: Any, preamble: str = PREAMBLE,
                 postamble: str = POSTAMBLE) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidInputError("the model's tokenizer has no chat template")
        self._tokenizer = tokenizer
        self._preamble = preamble
        self._postamble = postamble
        header = self._render(NO_MESSAGES, native_tools=False)[0]
        # Whether the template renders tools after the system message, as the memory span
        # needs; if not (it ignores them, or changes the header with them, as Llama 3.1's
        # does), the footer gets our own tool prompt.
        self.renders_tools = template_renders_tools(tokenizer) and self._render(
            NO_MESSAGES, [PROBE_TOOL], native_tools=True)[0] == header
        self.header_ids = self._encode(header)
        digest = hashlib.sha256(json.dumps(
            [LAYOUT_VERSION, self.header_ids, tokenizer.chat_template, postamble]).encode())
        self.layout_id = digest.hexdigest()[:24]
        self.header_name = f"header:{self.layout_id}"
        self.fact_ids = lru_cache(maxsize=65536)(self._fact_ids)

    @property
    def tool_parser(self) -> str:
        """vLLM's tool parser for the calls of ``tool_choice="auto"``: the chat template's
        (:func:`~inferscale_memory.tools.format_parser`) where it renders the tools,
        else ``"hermes"``, which reads our own tool prompt's calls."""
        if not self.renders_tools:
            return OWN_TOOL_PARSER
        return format_parser(str(self._tokenizer.chat_template))

    def build(self, messages: Conversation | Sequence[dict[str, Any]],
              facts: Sequence[tuple[str, str]],
              tools: Sequence[dict[str, Any]] | None = None) -> PromptLayout:
        """Lay out ``messages`` (a :class:`~inferscale_memory.conversation.Conversation`,
        or messages it checks) with ``facts`` ((id, text) pairs, in prompt order) and
        ``tools``, rendered by the chat template where it puts them after the system
        message (:attr:`renders_tools`), else by our own
        :func:`~inferscale_memory.tools.tool_prompt` at the end of the system message;
        either way after the facts, so the memory span is the same."""
        header_text, footer_text = self._render(Conversation.check(messages), tools)
        if self._encode(header_text) != self.header_ids:
            if tools:  # a template whose header depends on the tools given (not the probe's)
                raise InvalidInputError("the chat template renders tools before the system "
                                        "message: the facts would follow another header")
            raise InvalidInputError("the chat template renders a message-dependent header")
        token_ids = list(self.header_ids)
        spans = []
        for fact_id, text in facts:
            ids = self.fact_ids(text)
            spans.append((fact_id, len(token_ids), len(token_ids) + len(ids)))
            token_ids.extend(ids)
        token_ids.extend(self._encode(footer_text))
        return PromptLayout(token_ids, len(self.header_ids), spans, self.layout_id)

    def capture_prompt(self, text: str | None, context: Sequence[str] = ()
                       ) -> tuple[list[int], int, int]:
        """The prompt that captures one fact (``None``: only the header).

        ``context``: texts of facts placed between the header and the fact (the fact's
        KV then has attended to them; only the fact's span is kept).
        Returns ``(ids, start, end)``: header + context + fact + padding, and the fact's span.
        """
        ids = self.fact_ids(text) if text is not None else ()
        prompt = list(self.header_ids)
        for other in context:
            prompt.extend(self.fact_ids(other))
        start = len(prompt)
        prompt.extend(ids)
        padding = self._encode("\n")[:1] * max(1, MIN_CAPTURE_TOKENS - len(prompt))
        return prompt + padding, start, start + len(ids)

    def _fact_ids(self, text: str) -> tuple[int, ...]:
        return tuple(self._encode(f"- {text.strip()}\n"))

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _render(self, messages: Conversation,
                tools: Sequence[dict[str, Any]] | None = None, *,
                native_tools: bool | None = None) -> tuple[str, str]:
        """Header and footer text; ``native_tools``: the template renders the tools and
        tool turns (default: :attr:`renders_tools`), else our own tool prompt does."""
        native = self.renders_tools if native_tools is None else native_tools
        conversation = template_messages(messages) if native \
            else own_template_messages(messages)
        extra = [m["content"] for m in conversation if m["role"] == "system"]
        rest = [m for m in conversation if m["role"] != "system"]
        own_tools = [tool_prompt(tools)] if tools and not native else []
        system = "\n\n".join([self._postamble, *extra, *own_tools])
        full = [{"role": "system", "content": f"{self._preamble}{SENTINEL}{system}"}, *rest]
        rendered = self._tokenizer.apply_chat_template(
            full, tokenize=False, add_generation_prompt=True,
            **({"tools": list(tools)} if tools and native else {}))
        if rendered.count(SENTINEL) != 1:
            raise InvalidInputError("the chat template does not keep the system message")
        header, footer = rendered.split(SENTINEL)
        return header, footer


def prompt_order(facts: Sequence[ScoredFact], order: str) -> list[ScoredFact]:
    """Retrieved ``facts`` (best first) in prompt order.

    ``"rank"``: best-ranked last, nearest the question. ``"time"``: oldest first, by
    ``created_at`` (then id), the order of the adds, e.g. for questions about when.
    """
    if order == "rank":
        return list(reversed(facts))
    if order == "time":
        return sorted(facts, key=lambda f: (f.fact.created_at, f.fact.id))
    raise InvalidInputError(f"fact order must be 'rank' or 'time', got {order!r}")


def tail_size(facts: int, recompute_tail: int, captured_alone: bool) -> int:
    """How many of a prompt's ``facts`` are computed from text at the end of its memory
    span: the last ``recompute_tail`` (``0`` injects every fact).

    When facts are captured after context facts (not ``captured_alone``), a tail that
    would leave a single fact to inject computes that one too: its KV is not what the
    text path computes for the first fact, its prefill costs next to nothing, and with
    every fact computed the KV path is the text path exactly. A fact captured alone, right
    after the header, is exact in first place and stays injected.
    """
    if recompute_tail > 0 and not captured_alone and facts - recompute_tail <= 1:
        return facts
    return min(facts, recompute_tail)


def prompt_contexts(prompt: Sequence[Fact], facts: Sequence[Fact], count: int
                    ) -> dict[str, tuple[str, ...]]:
    """Per fact id of ``facts``, the texts of the (at most ``count``) facts right before it
    in ``prompt``: a capture context taken from the prompt the fact sat in."""
    if count == 0:
        return {}
    at = {fact.id: i for i, fact in enumerate(prompt)}
    return {fact.id: tuple(f.text for f in prompt[max(0, at[fact.id] - count):at[fact.id]])
            for fact in facts}

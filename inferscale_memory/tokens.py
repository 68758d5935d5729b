"""Facts as token ids: capture and injection requests without a tokenizer or a store.

The text API (:class:`~inferscale_memory.MemoryEngine`) tokenizes facts and lays out the
prompt itself. Code that drives the engine with token ids, such as ``bench synthetic``
(random ids on a model shape with dummy weights) and tests of the injection path, builds
its requests here instead, in the library's own layout: ``header | facts | question``,
each fact captured after the header (and after the context facts a capture names, as the
library's ``capture_context`` places them), the header shared by every prompt.

A :class:`TokenRequest` goes to the engine's runtime as it is: ``control`` for a capture,
``complete``/``stream`` with ``params=`` for an answer (``params=None`` is the text path:
the same token ids, prefilled by vLLM).

Example:
    >>> facts = TokenFacts("alice", header_ids=[1, 2, 3])
    >>> capture = facts.capture("f0", [7, 8, 9])  # header + fact, both kept
    >>> capture.token_ids
    [1, 2, 3, 7, 8, 9]
    >>> prompt = facts.prompt([("f0", [7, 8, 9]), ("f1", [6, 6])], question=[4, 5],
    ...                       inject=1)  # f1 is computed by vLLM
    >>> prompt.token_ids, prompt.injected_tokens
    ([1, 2, 3, 7, 8, 9, 6, 6, 4, 5], 6)
    >>> runtime.run(runtime.control(capture.token_ids, capture.params))  # doctest: +SKIP
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

from inferscale_memory.connector.params import SHARED_NS, FactKey, RequestParams, Span
from inferscale_memory.errors import InvalidInputError

__all__ = ["TokenFacts", "TokenRequest"]


@dataclass(frozen=True)
class TokenRequest:
    """A prompt's token ids and what the connector does with them."""

    token_ids: list[int]  # the whole prompt
    params: RequestParams  # the connector's instructions (``kv_transfer_params``)

    @property
    def injected_tokens(self) -> int:
        """Prompt tokens named for injection (header included); the rest vLLM computes."""
        return sum(span.length for span in self.params.inject)


class TokenFacts:
    """One user's facts given as token ids, after a fixed header.

    Args:
        user_id: Who owns the facts: a request injects only its own user's.
        header_ids: The tokens every prompt starts with (captured with each fact, and
            injected, shared, with every prompt).
        layout: Names the layout in the prefix-cache salt and the header's pool entry;
            prompts of one layout reuse each other's cached blocks.
    """

    def __init__(self, user_id: str, header_ids: Sequence[int], *,
                 layout: str = "tokens") -> None:
        if not isinstance(user_id, str) or not user_id:
            raise InvalidInputError("user_id must be a non-empty string")
        self.user_id = user_id
        self.layout = layout
        self.header_ids = _ids(header_ids, "header_ids")
        self._header = FactKey(SHARED_NS, f"header:{layout}")

    def capture(self, fact_id: str, token_ids: Sequence[int],
                context: Sequence[Sequence[int]] = ()) -> TokenRequest:
        """The request that computes and keeps the KV of the header and of one fact.

        ``context`` (other facts' token ids) goes between the header and the fact, as
        :attr:`~inferscale_memory.MemoryConfig.capture_context` places a fact's most
        similar facts: the fact attends to them, and only its own KV is kept.
        """
        ids = _ids(token_ids, "a fact's token_ids")
        prompt = list(self.header_ids)
        for fact in context:
            prompt += _ids(fact, "a context fact's token_ids")
        start = len(prompt)
        spans = (Span(self._header, 0, len(self.header_ids)),
                 Span(self._key(fact_id), start, start + len(ids)))
        return TokenRequest(prompt + ids,
                            RequestParams(self.user_id, self.layout, capture=spans))

    def prompt(self, facts: Sequence[tuple[str, Sequence[int]]], question: Sequence[int], *,
               inject: int | None = None) -> TokenRequest:
        """``header | facts | question``, naming the header and the first ``inject`` facts
        (default: all) for injection; vLLM computes the facts after them and the question.

        A fact named here whose KV the engine lacks is computed by vLLM too (its report's
        ``missing`` says so), never an error.
        """
        count = len(facts) if inject is None else inject
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= len(facts):
            raise InvalidInputError(f"inject must be between 0 and {len(facts)}, got {inject!r}")
        ids = list(self.header_ids)
        spans = [Span(self._header, 0, len(ids))]
        ends = []
        for n, (fact_id, token_ids) in enumerate(facts):
            start = len(ids)
            ids += token_ids
            ends.append(len(ids))
            if n < count:
                spans.append(Span(self._key(fact_id), start, len(ids)))
        starts = [len(self.header_ids), *ends]  # the last one: the question's
        ids += question
        if not _are_ids(ids) or not all(map(operator.lt, starts, ends)):
            # Which part is bad, and why (rare: the whole prompt is checked at once, in C).
            for start, end in zip(starts, ends, strict=False):
                _ids(ids[start:end], "a fact's token_ids")
            _ids(ids[starts[-1]:], "question", empty=True)
        return TokenRequest(ids, RequestParams(self.user_id, self.layout, inject=tuple(spans)))

    def _key(self, fact_id: str) -> FactKey:
        if not isinstance(fact_id, str) or not fact_id:
            raise InvalidInputError("a fact id must be a non-empty string")
        return FactKey(self.user_id, fact_id)


_INT = {int}


def _are_ids(ids: list[int]) -> bool:
    """Whether ``ids`` are plain ints >= 0, checked in C (a prompt holds thousands)."""
    return not ids or (set(map(type, ids)) == _INT and min(ids) >= 0)


def _ids(values: Sequence[int], what: str, empty: bool = False) -> list[int]:
    ids = list(values)
    if ids and _are_ids(ids):
        return ids
    if not (ids or empty) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                 for t in ids):
        kind = "a" if empty else "a non-empty"
        raise InvalidInputError(f"{what} must be {kind} list of token ids (ints >= 0)")
    return ids

"""FactKV: the one owner of fact KV in the engine (capture, header capture, evict).

It holds what a capture needs and nothing more: the vLLM runtime that runs the capture
requests, the prompt builder that lays them out, and the counters they report to. Which
facts precede a fact in its capture prompt (its context) is the caller's choice, handed in
as texts: :class:`~inferscale_memory.memory.EngineMemory` reads them from the engine's
store, the Mem0 adapter from Mem0's, the engine from the prompt a fact was missing from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from inferscale_memory.capture_gate import CaptureGate
from inferscale_memory.connector.params import MAX_SPANS, FactKey, RequestParams, Span
from inferscale_memory.errors import EngineDiedError
from inferscale_memory.store import Fact

if TYPE_CHECKING:
    from inferscale_memory.layout import PromptBuilder, PromptLayout
    from inferscale_memory.results import KVStats
    from inferscale_memory.runtime import VllmRuntime

HEADER_USER = "inferscale"  # owner of capture requests for the shared header

logger = logging.getLogger(__name__)


class FactKV:
    """Computes, keeps and drops the KV of facts in the engine.

    ``gate`` bounds the capture work the engine is asked for at once (the engine's:
    two scheduler steps' worth, within half the pool, so that a chat never waits behind a
    whole big ``add`` and no capture in flight crowds another out of the pool);
    ``None`` sends every capture at once.
    """

    def __init__(self, runtime: VllmRuntime, builder: PromptBuilder, stats: KVStats,
                 gate: CaptureGate | None = None) -> None:
        self.runtime = runtime
        self.builder = builder
        self.stats = stats
        self.gate = gate or CaptureGate(None)

    async def capture(self, user_id: str, facts: Sequence[Fact],
                      contexts: Mapping[str, Sequence[str]] | None = None) -> None:
        """Compute and keep the KV of ``facts`` (concurrently).

        ``contexts`` (fact id -> texts) names the facts placed between the header and each
        fact in its capture prompt (only the fact's own KV is kept, but it has attended to
        them); the earliest are dropped until the prompt fits the model's context. A fact
        without an entry is captured right after the header.
        """
        contexts = contexts or {}
        budget = self.runtime.max_model_len - 1
        await asyncio.gather(*(self._capture_one(
            user_id, fact, self._fit(contexts.get(fact.id, ()), fact.text, budget))
            for fact in facts))

    def inject_params(self, layout: PromptLayout, user_id: str | None,
                      recompute_tail: int = 0) -> RequestParams | None:
        """Name the header and every fact but the last ``recompute_tail`` for injection.

        The connector injects a contiguous run of spans from position 0; vLLM computes
        the rest of the prompt, so the unnamed tail facts attend to all facts before them.
        Without facts the prompt is the plain conversation: nothing to inject.
        """
        if user_id is None or not layout.fact_spans:
            return None
        named = layout.fact_spans[:max(0, len(layout.fact_spans) - recompute_tail)]
        spans = [Span(FactKey("", self.builder.header_name), 0, layout.header_end)]
        spans += [Span(FactKey(user_id, fid), a, b) for fid, a, b in named]
        return RequestParams(user_id, layout.layout_id, inject=tuple(spans))

    async def capture_header(self) -> None:
        """Capture the shared prompt header on its own.

        Done once at start, before any fact: every prompt holds the header.
        """
        token_ids, header_end, _ = self.builder.capture_prompt(None)
        params = RequestParams(HEADER_USER, self.builder.layout_id, capture=(
            Span(FactKey("", self.builder.header_name), 0, header_end),))
        self.stats.record_report(await self.runtime.control(token_ids, params))

    async def evict(self, user_id: str, fact_ids: Sequence[str]) -> None:
        """Drop the KV of ``fact_ids`` from the engine (the facts themselves stay)."""
        keys = [FactKey(user_id, fact_id) for fact_id in fact_ids]
        for i in range(0, len(keys), MAX_SPANS):
            params = RequestParams(user_id, self.builder.layout_id,
                                   evict=tuple(keys[i:i + MAX_SPANS]))
            self.stats.record_report(
                await self.runtime.control(self.builder.header_ids[:1], params))

    async def evict_deleted(self, user_id: str, fact_ids: Sequence[str]) -> None:
        """:meth:`evict` the KV of facts just deleted from their store. An engine core that
        died took every fact's KV with it (a new engine starts with an empty pool), so
        the delete is whole: a warning, not an error."""
        try:
            await self.evict(user_id, fact_ids)
        except EngineDiedError:
            logger.warning("deleted %d fact(s); no KV to evict, the engine core died",
                           len(fact_ids))

    async def _capture_one(self, user_id: str, fact: Fact, context: Sequence[str] = ()) -> None:
        token_ids, start, end = self.builder.capture_prompt(fact.text, context)
        params = RequestParams(user_id, self.builder.layout_id, capture=(
            Span(FactKey("", self.builder.header_name), 0, len(self.builder.header_ids)),
            Span(FactKey(user_id, fact.id), start, end)))
        # The header is a prefix-cache hit: what the engine computes is the rest.
        computed = max(1, len(token_ids) - len(self.builder.header_ids))
        async with self.gate.hold(computed):
            report = await self.runtime.control(token_ids, params)
        self.stats.record_report(report)

    def _fit(self, context: Sequence[str], text: str, budget: int) -> tuple[str, ...]:
        """Drop the earliest context facts until the capture prompt fits the context."""
        while context and len(self.builder.capture_prompt(text, context)[0]) > budget:
            context = context[1:]
        return tuple(context)

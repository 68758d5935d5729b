"""What a chat call returns: the answer, its metrics and the facts it used."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferscale_memory.store import ScoredFact
from inferscale_memory.tools import ToolCall, ToolCallDelta

if TYPE_CHECKING:
    from inferscale_memory.connector.params import RequestParams
    from inferscale_memory.connector.report import ConnectorReport
    from inferscale_memory.layout import PromptLayout
    from inferscale_memory.runtime import Completion


@dataclass(frozen=True)
class ChatMetrics:
    """Timings and token counts of one answer.

    Attributes:
        mode: ``"kv"`` (facts injected as KV) or ``"text"`` (facts prefilled as text).
        ttft_ms: From the call to the first answer token (retrieval included).
        latency_ms: From the call to the last answer token.
        retrieval_ms: Embedding the query and searching the user's facts.
        prompt_tokens: Tokens of the whole prompt.
        memory_tokens: Tokens of the retrieved facts in the prompt.
        injected_tokens: Prompt tokens whose KV the connector wrote (header and facts).
        cached_tokens: Prompt tokens served by vLLM's own prefix cache.
        computed_tokens: Prompt tokens vLLM computed in this request.
        output_tokens: Tokens of the answer.
        fact_ids: Ids of the facts in the prompt, in prompt order (see ``fact_order``).
        recomputed_fact_ids: Facts named for injection whose KV was missing, so they were
            recomputed from text (and are recaptured in the background).
        injected_fact_ids: Facts whose KV was not computed for this answer: named for
            injection and found in the fact pool (or in vLLM's prefix cache of this
            user). The others were computed by vLLM: the tail of the default
            answer-quality policy (``recompute_tail``) and ``recomputed_fact_ids``.
        memory_used: Whether any fact was in the prompt. ``False``: answered without
            memory (no ``user_id``, a user with no facts yet, or no facts given): the plain
            conversation, nothing injected.
    """

    mode: str
    ttft_ms: float
    latency_ms: float
    retrieval_ms: float
    prompt_tokens: int
    memory_tokens: int
    injected_tokens: int
    cached_tokens: int
    computed_tokens: int
    output_tokens: int
    fact_ids: list[str] = field(default_factory=list)
    recomputed_fact_ids: list[str] = field(default_factory=list)
    injected_fact_ids: list[str] = field(default_factory=list)
    memory_used: bool = False

    @classmethod
    def of(cls, done: Completion, layout: PromptLayout, params: RequestParams | None,
           mode: str, start: float, retrieval_s: float) -> ChatMetrics:
        """The metrics of a finished answer to ``layout``, sent with ``params``, that was
        asked at ``perf_counter()`` time ``start`` and spent ``retrieval_s`` retrieving."""
        injected = done.report.injected_tokens
        prompt_tokens = len(layout.token_ids)
        fact_ids = [fid for fid, _, _ in layout.fact_spans]
        missing = {key.name for key in done.report.missing if key.ns}
        named = [span.key.name for span in params.inject if span.key.ns] if params else []
        return cls(
            mode=mode,
            ttft_ms=(retrieval_s + done.ttft_s) * 1000 if done.token_ids else 0.0,
            latency_ms=(time.perf_counter() - start) * 1000,
            retrieval_ms=retrieval_s * 1000,
            prompt_tokens=prompt_tokens,
            memory_tokens=layout.memory_tokens,
            injected_tokens=injected,
            cached_tokens=max(0, done.num_cached_tokens - injected),
            computed_tokens=prompt_tokens - done.num_cached_tokens,
            output_tokens=len(done.token_ids),
            fact_ids=fact_ids,
            recomputed_fact_ids=[fid for fid in fact_ids if fid in missing],
            injected_fact_ids=[fid for fid in named if fid not in missing],
            memory_used=bool(fact_ids),
        )


@dataclass(frozen=True)
class ChatResult:
    """An answer. ``token_ids``/``logprobs`` are the generated tokens (for A/B checks).

    ``tool_calls``: the calls the model made (``tools``), in OpenAI's shape through
    :meth:`ToolCall.to_dict`; ``text`` is then the content before them (often ``""``), and
    ``finish_reason`` is ``"tool_calls"``.
    """

    text: str
    metrics: ChatMetrics
    facts: list[ScoredFact]
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ChatChunk:
    """A piece of a streamed answer; the last chunk carries the whole ``result``.

    ``tool_calls``: pieces of tool calls (:class:`ToolCallDelta`, OpenAI's streamed shape).
    """

    text: str
    result: ChatResult | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class KVStats:
    """Counters of the engine's fact-KV pool since start (:attr:`MemoryEngine.kv_stats`).

    Attributes:
        captured: Facts (and headers) whose KV the engine stored.
        injected: Facts whose KV an answer loaded (hits).
        recomputed: Facts an answer named whose KV was gone, computed from text instead
            (misses; they are recaptured in the background).
        evicted: Facts dropped to keep the pool within ``kv_pool_gb`` (least recently
            used), or dropped from the host tier to keep it within ``kv_host_pool_gb``.
        demoted: Facts moved from the device pool to the host tier to make room.
        promoted: Demoted facts an answer named, copied back to the device (host hits).
        deleted: Facts whose KV a delete (or an update, before its recapture) dropped
            from the pool; ``pool_tokens`` shows the rows it gave back at once.
        pool_tokens: Token rows the device pool held at the last change.
        budget_tokens: The device pool's budget in token rows (``None``: unbounded).
        host_tokens: Token rows the host tier held at the last change.
        host_budget_tokens: The host tier's budget in token rows (``None``: no tier).
    """

    captured: int = 0
    injected: int = 0
    recomputed: int = 0
    evicted: int = 0
    demoted: int = 0
    promoted: int = 0
    deleted: int = 0
    pool_tokens: int = 0
    budget_tokens: int | None = None
    host_tokens: int = 0
    host_budget_tokens: int | None = None

    def record_report(self, report: ConnectorReport) -> None:
        """Count what the connector's report of a request says it did to the pool."""
        self.captured += len(report.captured)
        self.evicted += len(report.evicted)
        self.demoted += len(report.demoted)
        self.promoted += len(report.promoted)
        self.deleted += len(report.deleted)
        if report.pool_tokens is not None:
            self.pool_tokens = report.pool_tokens
            self.budget_tokens = report.budget_tokens
        if report.host_tokens is not None:
            self.host_tokens = report.host_tokens
            self.host_budget_tokens = report.host_budget_tokens

    def record_chat(self, metrics: ChatMetrics, report: ConnectorReport) -> None:
        """Count an answer that named facts for injection: its hits, its misses (computed
        by vLLM), and what its connector report says it did to the pool (promotions and
        the room made for them). An answer that named none counts nothing."""
        if not metrics.injected_fact_ids and not metrics.recomputed_fact_ids:
            return  # every named fact is one or the other
        self.injected += len(metrics.injected_fact_ids)
        self.recomputed += len(metrics.recomputed_fact_ids)
        self.record_report(report)

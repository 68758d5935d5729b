"""MemoryEngine: a vLLM engine whose answers get the user's facts injected as KV.

Example:
    >>> from inferscale_memory import MemoryEngine               # doctest: +SKIP
    >>> engine = MemoryEngine()                                  # embedded default model
    >>> engine.memory.add("Caroline moved to Berlin in May 2023.", user_id="caroline")
    >>> reply = engine.chat([{"role": "user", "content": "Where does Caroline live?"}],
    ...                     user_id="caroline", k=10)
    >>> print(reply.text, reply.metrics.ttft_ms, reply.metrics.injected_tokens)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

from inferscale_memory.config import MemoryConfig
from inferscale_memory.connector.params import FactKey, RequestParams, Span
from inferscale_memory.errors import (
    ContextLengthError,
    EngineClosedError,
    InvalidInputError,
    UnknownUserError,
)
from inferscale_memory.fact_kv import FactKV
from inferscale_memory.fields import FactCount, FactOrder, Mode, RecomputeTail, UnicodeText, check
from inferscale_memory.layout import (
    PromptBuilder,
    PromptLayout,
    prompt_contexts,
    prompt_order,
    tail_size,
    validate_messages,
)
from inferscale_memory.memory import EngineMemory
from inferscale_memory.options import DEFAULT_MAX_LOGPROBS, check_options
from inferscale_memory.results import ChatChunk, ChatMetrics, ChatResult, KVStats
from inferscale_memory.runtime import Completion, Delta, VllmRuntime
from inferscale_memory.store import Fact, MemoryStore, ScoredFact
from inferscale_memory.tools import (
    ToolRequest,
    ToolStream,
    check_tool_request,
    refuse_without_template,
    template_parser,
)

logger = logging.getLogger(__name__)


class MemoryEngine:
    """A vLLM engine with the inferscale connector, a fact store and a chat API.

    Args:
        model: A Hugging Face model folder; ``None`` uses the embedded default.
        config: A full :class:`MemoryConfig`; keyword ``overrides`` are applied on top.
        store: An open :class:`MemoryStore` to use instead of the configured one, or a
            str: the config field ``store`` (``"sqlite"`` or ``"postgres"``).
    """

    def __init__(self, model: str | None = None, *, config: MemoryConfig | None = None,
                 store: MemoryStore | str | None = None, **overrides: Any) -> None:
        from transformers import AutoTokenizer

        from inferscale_memory.embeddings import default_embedder
        from inferscale_memory.models import resolve_model

        if isinstance(store, str):  # MemoryEngine(store="postgres", postgres_url=...)
            overrides["store"], store = store, None
        if config is None:
            config = MemoryConfig.load(model=model, **overrides)
        elif model is not None or overrides:
            config = config.replace(**overrides, **({"model": model} if model else {}))
        self._config = config
        self.model_path = resolve_model(config.model, config.cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        self.builder = PromptBuilder(self.tokenizer)
        # vLLM's tool parser of tool_choice="auto" (a --tool-call-parser name), chosen from
        # the chat template; None: the template has no tools. Assign to override.
        self.tool_parser: str | None = template_parser(self.tokenizer)
        with contextlib.ExitStack() as undo:  # a failed start closes what it opened
            if store is None:
                store = MemoryStore.from_config(config, default_embedder(config.embedder))
                undo.callback(store.close)
            self.store = store
            self.runtime = VllmRuntime(self.model_path, config)
            undo.callback(self.runtime.close)
            self.kv_stats = KVStats()
            self.fact_kv = FactKV(self.runtime, self.builder, self.kv_stats)
            self.memory = EngineMemory(self.store, self.fact_kv, config)
            self.runtime.run(self.fact_kv.capture_header())
            undo.pop_all()
        self._background: set[asyncio.Future[Any]] = set()

    @property
    def config(self) -> MemoryConfig:
        """The engine's settings; assigning new ones (e.g. another quality policy) applies
        them to the next answer and the next capture."""
        return self._config

    @config.setter
    def config(self, config: MemoryConfig) -> None:
        self._config = config
        self.memory.config = config

    # -- answering -----------------------------------------------------------------------

    def chat(self, messages: Sequence[dict[str, Any]], *, user_id: str | None = None,
             k: int | None = None, mode: str = "kv", **options: Any) -> ChatResult:
        """Answer the conversation with ``user_id``'s top-``k`` facts in memory.

        Args:
            messages: OpenAI-style ``[{"role": ..., "content": ...}]``; the last one is the
                user's question (the retrieval query), or tool results (``role: "tool"``)
                of the assistant's ``tool_calls`` before them, answering that question.
            user_id: Whose facts to use; ``None`` answers without memory, and so does a
                user with no facts yet (``metrics.memory_used`` is ``False``).
            k: Facts to retrieve (default ``config.k``).
            mode: ``"kv"`` injects the facts' KV; ``"text"`` sends the identical token ids
                and lets vLLM prefill them (for A/B and as the fallback).
            fact_order: ``"rank"`` (best-ranked fact last) or ``"time"`` (oldest first);
                default ``config.fact_order``.
            recompute_tail: Facts at the end of the memory span that vLLM computes from
                text instead of injecting (``kv`` mode); default ``config.recompute_tail``.
            memory: ``False`` answers ``user_id`` without their facts (the server's
                ``memory: "off"``); vLLM's prefix cache is still shared only within that
                user (without ``user_id``, within one shared anonymous user).
            **options: ``max_tokens``, ``temperature``, ``stop``, ``logprobs``, ``seed``,
                ``top_p``, ``top_k``, ``presence_penalty``, ``frequency_penalty``,
                ``ignore_eos`` (generate exactly ``max_tokens``, for benchmarks); and, in
                OpenAI's shapes, ``tools`` (function schemas), ``tool_choice`` (``"auto"``,
                ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name"}}``),
                ``parallel_tool_calls`` and ``response_format`` (``json_object``,
                ``json_schema``): see :mod:`inferscale_memory.tools`. Tool calls come back
                in :attr:`ChatResult.tool_calls`.
        """
        return self.runtime.run(self._achat(messages, user_id=user_id, k=k, mode=mode,
                                            **options))

    async def achat(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> ChatResult:
        """Async :meth:`chat`, awaitable from any event loop (an application's own, or the
        engine's, as in the server)."""
        return await self.runtime.call(self._achat(messages, **kwargs))

    async def _achat(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> ChatResult:
        result = None
        async for chunk in self._astream_chat(messages, **kwargs):
            result = chunk.result or result
        assert result is not None
        return result

    def stream_chat(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> Iterator[ChatChunk]:
        """Like :meth:`chat`, yielding text pieces; the last chunk holds the result."""
        agen = self._astream_chat(messages, **kwargs)

        async def step() -> ChatChunk:
            return await agen.__anext__()

        try:
            while True:
                try:
                    yield self.runtime.run(step())
                except StopAsyncIteration:
                    return
        finally:  # a caller that stops early: close on the engine loop, vLLM aborts
            with contextlib.suppress(EngineClosedError):
                self.runtime.run(agen.aclose())

    async def astream_chat(self, messages: Sequence[dict[str, Any]],
                           **kwargs: Any) -> AsyncIterator[ChatChunk]:
        """Async streaming answer from any event loop; see :meth:`chat` for the arguments
        (and ``facts``, best first, e.g. a search result, to skip retrieval)."""
        async for chunk in self.runtime.iterate(self._astream_chat(messages, **kwargs)):
            yield chunk

    async def _astream_chat(self, messages: Sequence[dict[str, Any]], *,
                            user_id: str | None = None, k: int | None = None,
                            mode: str = "kv", facts: Sequence[Fact | ScoredFact] | None = None,
                            fact_order: str | None = None, recompute_tail: int | None = None,
                            memory: bool = True, tools: Any = None,
                            tool_choice: Any = None, parallel_tool_calls: Any = None,
                            response_format: Any = None,
                            **options: Any) -> AsyncGenerator[ChatChunk, None]:
        """:meth:`astream_chat` on the engine loop. ``facts`` must belong to ``user_id``."""
        start = time.perf_counter()
        conversation, k, max_tokens = self._check_request(messages, k, mode, options)
        order, tail = self._check_quality(fact_order, recompute_tail)
        tooling = self._check_tools(conversation, tools, tool_choice, parallel_tool_calls,
                                    response_format)
        if not isinstance(memory, bool):
            raise InvalidInputError("memory must be true or false")
        if not memory and facts is not None:
            raise InvalidInputError("facts= answers from memory: leave memory=True")
        if not memory:
            found: list[ScoredFact] = []
        elif facts is None:
            query = next(m for m in reversed(conversation) if m["role"] == "user")
            found = await self._retrieve(query["content"], user_id, k)
        else:
            found = self._own_facts(facts, user_id)
        retrieval_s = time.perf_counter() - start
        ordered = prompt_order(found, order)
        layout = self.builder.build(conversation, [(f.fact.id, f.fact.text) for f in ordered],
                                    tooling.tools if tooling else None)
        self._check_length(layout, max_tokens)
        tail = tail_size(len(layout.fact_spans), tail, self.config.capture_context == 0)
        # A tail of every fact leaves nothing worth injecting: the request is the text path's.
        every = tail > 0 and tail == len(layout.fact_spans)
        params = self._inject_params(layout, user_id, tail) if mode == "kv" and not every \
            else None
        if tooling is not None:
            options.update(structured_outputs=tooling.structured_outputs(),
                           skip_special_tokens=not (tooling.calls_tools
                                                    and tooling.choice == "auto"))
        stream = ToolStream(tooling) if tooling is not None else None
        deltas = self.runtime.stream(layout.token_ids, max_tokens=max_tokens, params=params,
                                     user=user_id, **options)
        if options.get("structured_outputs"):
            deltas = _refusing_bad_schemas(deltas)
        async for delta in deltas:
            text, calls = stream.feed(delta.text) if stream else (delta.text, [])
            if delta.completion is None:
                if text or calls:
                    yield ChatChunk(text, tool_calls=calls)
                continue
            result = self._result(delta.completion, layout, ordered, mode, params, start,
                                  retrieval_s)
            self._recapture(user_id, ordered, result.metrics.recomputed_fact_ids)
            if stream is not None:
                result = self._parse_tools(result, stream)
                rest, more = stream.finish(result.text, result.tool_calls)
                text, calls = text + rest, calls + more
            yield ChatChunk(text, result, calls)

    def answer(self, messages: Sequence[dict[str, Any]], facts: Sequence[Fact | ScoredFact], *,
               user_id: str, mode: str = "kv", **options: Any) -> ChatResult:
        """Answer with given ``facts`` (best first, e.g. from :meth:`EngineMemory.search` or
        Mem0's ``search``) instead of retrieving them."""
        return self.runtime.run(self._achat(messages, user_id=user_id, mode=mode,
                                            facts=list(facts), **options))

    def arun(self, coro: Any) -> Any:
        """Run a coroutine of this engine (e.g. :meth:`achat`) from synchronous code."""
        return self.runtime.run(coro)

    # -- KV management -------------------------------------------------------------------

    def drop_kv(self, user_id: str, fact_ids: Sequence[str]) -> None:
        """Evict facts' KV from the engine but keep the facts: the next answer that uses
        them recomputes them from text (and recaptures them)."""
        self.runtime.run(self.fact_kv.evict(user_id, list(fact_ids)))

    def warm(self, user_id: str) -> int:
        """Capture the KV of all of ``user_id``'s facts now (e.g. after a restart)."""
        facts = self.store.list(user_id=user_id)
        self.runtime.run(self.memory.capture(user_id, facts))
        return len(facts)

    def wait_for_background(self, timeout: float | None = 120) -> None:
        """Wait until background recaptures (after recomputed facts) are done."""
        async def drain() -> None:
            while self._background:
                await asyncio.gather(*list(self._background))

        self.runtime.run(drain(), timeout)

    def reset_prefix_cache(self) -> None:
        """Forget vLLM's prefix cache, so the next prefill is computed afresh."""
        self.runtime.run(self.runtime.reset_prefix_cache())

    @property
    def healthy(self) -> bool:
        """Whether the engine answers: ``False`` once vLLM failed or :meth:`close` ran."""
        return self.runtime.healthy

    def close(self) -> None:
        """Stop the engine and close the store."""
        self.runtime.close()
        self.store.close()

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------

    def _check_request(self, messages: Any, k: int | None, mode: str,
                       options: dict[str, Any]) -> tuple[list[dict[str, Any]], int, int]:
        conversation = validate_messages(messages)
        if not conversation or conversation[-1]["role"] not in ("user", "tool") \
                or not any(m["role"] == "user" for m in conversation):
            raise InvalidInputError("the last message must be the user's (or tool results)")
        k = check(FactCount, self.config.k if k is None else k, "k")
        check(Mode, mode, "mode")
        checked = check_options(
            options, default_max_tokens=self.config.max_tokens,
            max_logprobs=self.config.engine_args.get("max_logprobs", DEFAULT_MAX_LOGPROBS))
        options.clear()
        options.update(checked)
        return conversation, k, options.pop("max_tokens")

    def _check_tools(self, conversation: list[dict[str, Any]], tools: Any, tool_choice: Any,
                     parallel_tool_calls: Any, response_format: Any) -> ToolRequest | None:
        tooling = check_tool_request(tools, tool_choice, parallel_tool_calls, response_format,
                                     self.tool_parser)
        uses_tools = (tooling is not None and tooling.calls_tools) or any(
            m["role"] == "tool" or m.get("tool_calls") for m in conversation)
        if uses_tools and self.tool_parser is None:
            raise refuse_without_template(self.model_path.name)
        return tooling

    def _parse_tools(self, result: ChatResult, stream: ToolStream) -> ChatResult:
        """``result`` with the tool calls of its text (see :class:`ToolRequest.parse`)."""
        content, calls = stream.request.parse(result.text, self.tokenizer)
        if not calls:
            return result
        if stream.named_call_id is not None:
            calls = [dataclasses.replace(calls[0], id=stream.named_call_id)]
        finish = "tool_calls" if result.finish_reason == "stop" else result.finish_reason
        return dataclasses.replace(result, text=content or "", tool_calls=calls,
                                   finish_reason=finish)

    def _check_quality(self, fact_order: str | None, recompute_tail: int | None
                       ) -> tuple[str, int]:
        order = self.config.fact_order if fact_order is None else fact_order
        tail = self.config.recompute_tail if recompute_tail is None else recompute_tail
        return check(FactOrder, order, "fact_order"), check(RecomputeTail, tail, "recompute_tail")

    async def _retrieve(self, query: str, user_id: str | None, k: int) -> list[ScoredFact]:
        if user_id is None:
            return []
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                None, lambda: self.store.search(query, user_id=user_id, k=k))
        except UnknownUserError:  # no facts yet: answered without memory, as with none left
            return []

    @staticmethod
    def _own_facts(facts: Sequence[Fact | ScoredFact], user_id: str | None) -> list[ScoredFact]:
        scored = [f if isinstance(f, ScoredFact) else ScoredFact(f, 0.0) for f in facts]
        if any(not isinstance(s.fact, Fact) or s.fact.user_id != user_id for s in scored):
            raise InvalidInputError("facts must be Fact objects of the same user_id")
        for s in scored:
            check(UnicodeText, s.fact.text, "a fact's text")
        return scored

    def _check_length(self, layout: PromptLayout, max_tokens: int) -> None:
        limit = self.runtime.max_model_len
        if len(layout.token_ids) + max_tokens > limit:
            raise ContextLengthError(
                f"prompt of {len(layout.token_ids)} tokens + max_tokens {max_tokens} exceeds "
                f"the context of {limit}; shorten the conversation or lower k/max_tokens")

    def _inject_params(self, layout: PromptLayout, user_id: str | None,
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

    def _result(self, done: Completion, layout: PromptLayout, ordered: list[ScoredFact],
                mode: str, params: RequestParams | None, start: float, retrieval_s: float
                ) -> ChatResult:
        report = done.report
        injected = int(report.get("injected_tokens", 0))
        prompt_tokens = len(layout.token_ids)
        fact_ids = [fid for fid, _, _ in layout.fact_spans]
        missing = {name for ns, name in report.get("missing", []) if ns}
        named = [span.key.name for span in params.inject if span.key.ns] if params else []
        metrics = ChatMetrics(
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
        if named:  # facts named for injection: hits, or misses that vLLM computed
            recomputed = len(metrics.recomputed_fact_ids)
            self.kv_stats.record_answer(len(named) - recomputed, recomputed)
            self.kv_stats.record_report(report)  # promotions and the room made for them
        return ChatResult(done.text, metrics, ordered, layout.token_ids, done.token_ids,
                          done.finish_reason, done.logprobs)

    def _recapture(self, user_id: str | None, facts: list[ScoredFact],
                   missing: list[str]) -> None:
        if user_id is None or not missing:
            return
        task = asyncio.ensure_future(self._arecapture(user_id, [f.fact for f in facts],
                                                      set(missing)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _arecapture(self, user_id: str, prompt: list[Fact], missing: set[str]) -> None:
        """Capture the facts of a prompt whose KV was missing. Their capture context is
        read from the engine's store when it holds the user, as at ``add``; facts handed
        in from another store (e.g. Mem0's) take the facts before them in this prompt."""
        wanted = [fact for fact in prompt if fact.id in missing]
        if await asyncio.get_running_loop().run_in_executor(None, self.store.has_user,
                                                            user_id):
            await self.memory.capture(user_id, wanted)
        else:
            await self.fact_kv.capture(user_id, wanted,
                                       prompt_contexts(prompt, wanted, self.config.capture_context))


async def _refusing_bad_schemas(deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """``deltas``, with vLLM's refusal of a schema its guided decoding cannot compile (a
    ``VLLMValidationError``, a ``ValueError`` in vLLM 0.26 but not in 0.32) raised as
    :class:`InvalidInputError`: the client's mistake, and vLLM goes on serving."""
    from inferscale_memory.connector.compat import request_validation_errors

    started = False
    try:
        async for delta in deltas:
            started = True
            yield delta
    except request_validation_errors() as exc:
        if started:
            raise
        raise InvalidInputError(f"the JSON schema (tools or response_format) cannot be used "
                                f"for guided decoding: {exc}") from exc
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]

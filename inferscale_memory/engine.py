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
import math
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from inferscale_memory import sizing
from inferscale_memory.capture_gate import CaptureGate, capture_budget
from inferscale_memory.config import MemoryConfig
from inferscale_memory.connector.params import RequestParams
from inferscale_memory.errors import (
    ContextLengthError,
    EngineClosedError,
    EngineError,
    InvalidInputError,
    UnknownUserError,
)
from inferscale_memory.fact_kv import FactKV
from inferscale_memory.layout import PromptBuilder, PromptLayout, prompt_order, tail_size
from inferscale_memory.memory import EngineMemory
from inferscale_memory.options import check_chat, check_given_facts
from inferscale_memory.results import ChatChunk, ChatMetrics, ChatResult, KVStats
from inferscale_memory.runtime import Completion, VllmRuntime, refusing_bad_schemas
from inferscale_memory.store import Fact, MemoryStore, ScoredFact
from inferscale_memory.store.threads import in_store_thread
from inferscale_memory.tools import ToolStream

logger = logging.getLogger(__name__)
# The module name that multiprocessing's spawn gives the main script it runs again in a
# new process (vLLM spawns its engine processes).
SPAWNED = "__mp_main__"
UNGUARDED = ("vLLM's engine process ran your script again and it started another engine: "
             "put the code that starts MemoryEngine under `if __name__ == \"__main__\":`")


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
        _refuse_spawned_reimport()
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
        sizing.check_memory(config, self.model_path)  # a pool that cannot fit: refused now
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        self.builder = PromptBuilder(self.tokenizer)
        # vLLM's tool parser of tool_choice="auto" (a --tool-call-parser name), chosen from
        # the chat template ("hermes" for our own tool prompt when the template ignores
        # tools or renders them before the system message). Assign to override; None
        # refuses tools.
        self.tool_parser: str | None = self.builder.tool_parser
        with contextlib.ExitStack() as undo:  # a failed start closes what it opened
            if store is None:
                store = MemoryStore.from_config(config, default_embedder(config.embedder))
                undo.callback(store.close)
            self.store = store
            self.runtime = _start_runtime(self.model_path, config)
            undo.callback(self.runtime.close)
            self.kv_stats = KVStats()
            step_tokens = self.runtime.engine_settings["max_num_batched_tokens"]
            self.fact_kv = FactKV(self.runtime, self.builder, self.kv_stats)
            self.memory = EngineMemory(self.store, self.fact_kv, config)
            self.runtime.run(self.fact_kv.capture_header())
            # The header's report gives the pool's budget and the rows the header holds.
            stats = self.kv_stats
            room = None if stats.budget_tokens is None else stats.budget_tokens - stats.pool_tokens
            self.fact_kv.gate = CaptureGate(capture_budget(step_tokens, room))
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

    @property
    def model_name(self) -> str:
        """The model's name as users know it: a hub id as given (``"Qwen/Qwen2.5-7B-
        Instruct"``, even when it resolved to a snapshot folder of the local cache named
        after a revision hash), otherwise the model folder's name."""
        given = self._config.model
        if given and not Path(given).expanduser().exists():
            return given
        return self.model_path.name

    @property
    def max_model_len(self) -> int:
        """The engine's context window in tokens (prompt and answer together)."""
        return self.runtime.max_model_len

    def count_prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The length of ``messages`` in tokens as :meth:`chat` sends them without memory
        (``memory=False``): the chat template around the engine's own system preamble.

        Raises:
            InvalidInputError: Messages the engine would refuse.
        """
        return len(self.builder.build(messages, []).token_ids)

    # -- answering -----------------------------------------------------------------------

    def chat(self, messages: Sequence[dict[str, Any]], *, user_id: str | None = None,
             k: int | None = None, mode: str = "kv", **options: Any) -> ChatResult:
        """Answer the conversation with ``user_id``'s top-``k`` facts in memory.

        Args:
            messages: OpenAI-style ``[{"role": ..., "content": ...}]`` (``developer`` is
                taken as ``system``, text parts are joined); the last one is the user's
                question (the retrieval query), or tool results (``role: "tool"``) of the
                assistant's ``tool_calls`` before them, answering that question.
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
                user (without ``user_id``, with no other call: name a user to share).
            timeout: Seconds the whole answer may take (``None``: no limit); past them
                the request is cancelled and :class:`TimeoutError` raised. Streams count
                from the call to the last chunk, so a first chunk that comes late fails too.
            **options: ``max_tokens`` (or OpenAI's ``max_completion_tokens``),
                ``temperature``, ``stop``, ``logprobs``, ``seed``,
                ``top_p``, ``top_k``, ``presence_penalty``, ``frequency_penalty``,
                ``ignore_eos`` (generate exactly ``max_tokens``, for benchmarks); and, in
                OpenAI's shapes, ``tools`` (function schemas), ``tool_choice`` (``"auto"``,
                ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name"}}``),
                ``parallel_tool_calls`` and ``response_format`` (``json_object``,
                ``json_schema``): see :mod:`inferscale_memory.tools`. Tool calls come back
                in :attr:`ChatResult.tool_calls`.

        Raises:
            InvalidInputError: Arguments the engine refuses, its ``param`` naming the one at
                fault (``"messages.1.content"``, ``"tools.0.function.name"``); a
                :class:`ContextLengthError` past the context, a :class:`SchemaError` for a
                schema that cannot guide decoding.
            RequestFailedError: vLLM failed this request (``finish_reason`` "error") and
                goes on serving; sending it again may succeed.
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
                            timeout: float | None = None,
                            **kwargs: Any) -> AsyncGenerator[ChatChunk, None]:
        """:meth:`_answer` on the engine loop, within ``timeout`` seconds from the call to
        the last chunk (``None``: no limit); past it, the request is cancelled (vLLM
        aborts it) and :class:`TimeoutError` raised. Every face of chat (``chat``,
        ``achat``, ``stream_chat``, ``astream_chat``) takes ``timeout`` through here."""
        timeout = _check_timeout(timeout)
        answer = self._answer(messages, **kwargs)
        if timeout is None:
            async for chunk in answer:
                yield chunk
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(answer.__anext__(), deadline - loop.time())
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise TimeoutError(f"no answer within {timeout} s (the timeout); the "
                                       "request was cancelled") from None
                yield chunk
        finally:
            await answer.aclose()

    async def _answer(self, messages: Sequence[dict[str, Any]], *,
                      user_id: str | None = None, k: int | None = None,
                      mode: str = "kv", facts: Sequence[Fact | ScoredFact] | None = None,
                      fact_order: str | None = None, recompute_tail: int | None = None,
                      memory: bool = True,
                      **options: Any) -> AsyncGenerator[ChatChunk, None]:
        """The answer's chunks, on the engine loop. ``facts`` must belong to ``user_id``;
        ``options`` are :func:`~inferscale_memory.options.check_chat`'s (tools included)."""
        start = time.perf_counter()
        request = check_chat(self.config, messages, k=k, mode=mode, memory=memory,
                             fact_order=fact_order, recompute_tail=recompute_tail,
                             tool_parser=self.tool_parser, model_name=self.model_name,
                             **options)
        tooling = request.tooling
        if not memory and facts is not None:
            raise InvalidInputError("facts= answers from memory: leave memory=True")
        if not memory:
            found: list[ScoredFact] = []
        elif facts is None:
            query = next(m for m in reversed(request.conversation) if m["role"] == "user")
            found = await self._retrieve(query["content"], user_id, request.k)
        else:
            found = check_given_facts(facts, user_id)
        retrieval_s = time.perf_counter() - start
        ordered = prompt_order(found, request.fact_order)
        layout = self.builder.build(request.conversation,
                                    [(f.fact.id, f.fact.text) for f in ordered],
                                    tooling.tools if tooling else None)
        self._check_length(layout, request.max_tokens)
        tail = tail_size(len(layout.fact_spans), request.recompute_tail,
                         self.config.capture_context == 0)
        # A tail of every fact leaves nothing worth injecting: the request is the text path's.
        every = tail > 0 and tail == len(layout.fact_spans)
        params = self.fact_kv.inject_params(layout, user_id, tail) \
            if mode == "kv" and not every else None
        stream = ToolStream(tooling) if tooling is not None else None
        deltas = self.runtime.stream(layout.token_ids, max_tokens=request.max_tokens,
                                     params=params, user=user_id, **request.sampling)
        if tooling is not None and tooling.guided_param is not None:
            deltas = refusing_bad_schemas(deltas, tooling.guided_param)
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
        facts = self.memory.list(user_id=user_id)
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
        """Stop the engine and close the store; every later call raises
        :class:`EngineClosedError`."""
        self.memory.close()
        self.runtime.close()
        self.store.close()

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------

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

    async def _retrieve(self, query: str, user_id: str | None, k: int) -> list[ScoredFact]:
        if user_id is None:
            return []
        try:
            return await in_store_thread(self.store.search, query, user_id=user_id, k=k)
        except UnknownUserError:  # no facts yet: answered without memory, as with none left
            return []

    def _check_length(self, layout: PromptLayout, max_tokens: int) -> None:
        limit = self.runtime.max_model_len
        if len(layout.token_ids) + max_tokens > limit:
            raise ContextLengthError(
                f"prompt of {len(layout.token_ids)} tokens + max_tokens {max_tokens} exceeds "
                f"the context of {limit}; shorten the conversation or lower k/max_tokens")

    def _result(self, done: Completion, layout: PromptLayout, ordered: list[ScoredFact],
                mode: str, params: RequestParams | None, start: float, retrieval_s: float
                ) -> ChatResult:
        metrics = ChatMetrics.of(done, layout, params, mode, start, retrieval_s)
        self.kv_stats.record_chat(metrics, done.report)
        return ChatResult(done.text, metrics, ordered, layout.token_ids, done.token_ids,
                          done.finish_reason, done.logprobs)

    def _recapture(self, user_id: str | None, facts: list[ScoredFact],
                   missing: list[str]) -> None:
        if user_id is None or not missing:
            return
        task = asyncio.ensure_future(self.memory.recapture(user_id, [f.fact for f in facts],
                                                           set(missing)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _refuse_spawned_reimport() -> None:
    """Fail at once where the engine is being started by a script that vLLM's spawned
    process re-imports: multiprocessing's spawn runs the main script again, as module
    ``__mp_main__``, and its top level is starting an engine without the guard."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == SPAWNED:
            raise EngineError(UNGUARDED)
        frame = frame.f_back  # type: ignore[assignment]


def _start_runtime(model_path: Path, config: MemoryConfig) -> VllmRuntime:
    """Start vLLM; a start that failed because its spawned process re-imported an
    unguarded script (:func:`_refuse_spawned_reimport` there) says only that."""
    try:
        return VllmRuntime(model_path, config)
    except EngineError as exc:
        if UNGUARDED in str(exc):
            raise EngineError(UNGUARDED) from None
        raise


def _check_timeout(timeout: Any) -> float | None:
    """``timeout`` as seconds, or ``None``; a bad value is an :class:`InvalidInputError`."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise InvalidInputError(f"timeout must be a positive number of seconds or None; "
                                f"got {timeout!r}")
    return float(timeout)

"""The vLLM engine, run on a background event loop, and the requests the library sends.

:class:`VllmRuntime` owns vLLM's ``AsyncLLM`` (the default multiprocess engine: the
engine core runs in its own process) with the inferscale connector, and turns the three
kinds of requests into small coroutines: answer (optionally injecting facts), capture
(store facts' KV) and evict (drop facts' KV). Sync callers use :meth:`VllmRuntime.run`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import secrets
import shutil
import threading
import time
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from inferscale_memory import lifeline, sizing
from inferscale_memory.config import MemoryConfig
from inferscale_memory.connector.params import RequestParams, cache_salt
from inferscale_memory.connector.report import ConnectorReport
from inferscale_memory.driver import frontend, guided_json
from inferscale_memory.errors import (
    EngineClosedError,
    EngineDiedError,
    EngineError,
    RequestFailedError,
    SchemaError,
)
from inferscale_memory.vllm_log import VllmLog

logger = logging.getLogger(__name__)
T = TypeVar("T")

# What the request that readies guided decoding as the engine starts is made to answer.
GUIDED_WARMUP = "ready"
_DONE = object()
SHUTDOWN_TIMEOUT_S = 30.0  # vLLM's processes get this long to exit before being killed
_open: weakref.WeakSet[VllmRuntime] = weakref.WeakSet()  # closed at interpreter exit
_exit_hook = False


@dataclass
class Completion:
    """One finished generation and what the engine reported about it."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    latency_s: float = 0.0
    num_cached_tokens: int = 0
    report: ConnectorReport = field(default_factory=ConnectorReport)
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class Delta:
    """A streamed piece of an answer; the last one has ``completion`` set."""

    text: str
    completion: Completion | None = None


class VllmRuntime:
    """vLLM's async engine with the connector, on a private event loop thread."""

    def __init__(self, model_path: Path, config: MemoryConfig, *, connector: bool = True
                 ) -> None:
        """Start vLLM with ``model_path`` and ``config``; ``connector=False`` starts it
        without the KV connector (plain vLLM with the same arguments: the benchmarks'
        like-for-like floor), which serves text prompts only."""
        self.model_path = model_path
        self.config = config
        self.connector = connector
        self.max_model_len = config.max_model_len  # None: the model's, read after start
        self.detokenize = not config.engine_args.get("skip_tokenizer_init", False)
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="inferscale-engine-loop", daemon=True)
        self._thread.start()
        self._closed = False
        self._pending: set[Future[Any]] = set()  # sync callers' waits, failed at close
        self._log = VllmLog(show=config.vllm_logs)
        self.socket_folder: Path | None = None  # vLLM's sockets of this engine; gone at close
        logger.info("starting vLLM with %s%s", model_path,
                    f" (its output: {self._log.path})" if self._log.path else "")
        started = time.perf_counter()
        try:
            with self._log.capturing():
                self._llm = self.run(self._start())
        except Exception as exc:
            self._stop_loop()
            self._remove_socket_folder()
            self._log.close(failed=True)
            tail = self._log.tail()
            raise EngineError(f"vLLM failed to start with {model_path}: {exc}"
                              + (f"\nthe end of vLLM's log ({self._log.path}):\n{tail}"
                                 if tail else "")) from exc
        self.max_model_len = frontend.max_model_len(self._llm)
        _open.add(self)
        _close_open_runtimes_at_exit()
        # vLLM's engine core builds its grammar backend on the first guided request it
        # is sent, in its scheduling loop (0.6 s with a 151k-token vocabulary on an H200
        # host, every request waiting): one of ours pays for it now.
        try:
            self.guided_warmup = self._ready_guided_decoding() if self.detokenize else None
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - started
        logger.info("vLLM ready in %.1f s", self.start_s)

    def _ready_guided_decoding(self) -> Completion | None:
        """Send one guided request (its grammar admits only :data:`GUIDED_WARMUP`) and
        return its completion; ``None``, with a warning, where vLLM fails it (a tokenizer
        its grammar backend cannot read: guided requests would fail anyway)."""
        grammar = f'root ::= "{GUIDED_WARMUP}"'
        try:
            return self.run(self.complete([0], max_tokens=8,
                                          structured_outputs={"grammar": grammar}))
        except RequestFailedError as exc:
            logger.warning("guided decoding is not ready: %s", exc)
            return None

    async def _start(self) -> Any:
        frontend.check_vllm_version()
        args = engine_arguments(self.model_path, self.config, connector=self.connector)
        lifeline.mark_owner()  # vLLM's processes end with this one (inferscale_memory.lifeline)
        self.socket_folder = frontend.new_socket_folder()
        return frontend.start_async_llm(
            args, frontend.start_environment(self.config.kv_cache_gb, self.socket_folder))

    # -- running coroutines --------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the engine loop and wait for its result (from any other thread)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("VllmRuntime.run called from the engine loop; await instead")
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the engine loop without waiting.

        Raises:
            EngineClosedError: The engine was closed (``coro`` is not run); a wait still in
                progress when it closes fails with it too.
        """
        if self._closed:
            coro.close()
            raise EngineClosedError("the engine is closed; start a new MemoryEngine")
        future = asyncio.run_coroutine_threadsafe(self._closing_fails(coro), self._loop)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    async def _closing_fails(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``, failing with :class:`EngineClosedError` when ``close()`` cancels it."""
        try:
            return await coro
        except asyncio.CancelledError:
            if self._closed:
                raise EngineClosedError("the engine was closed") from None
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the engine loop from whatever loop the caller runs on (the
        engine's own, or an application's: the result wakes that loop up)."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    async def iterate(self, agen: AsyncIterator[T]) -> AsyncIterator[T]:
        """Iterate an async generator of the engine loop from whatever loop the caller runs
        on, one item at a time; it is closed on the engine loop if the caller stops early."""
        if asyncio.get_running_loop() is self._loop:
            async for item in agen:
                yield item
            return

        async def step() -> Any:
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return _DONE

        async def close() -> None:
            await agen.aclose()  # type: ignore[attr-defined]

        try:
            while (item := await self.call(step())) is not _DONE:
                yield item
        finally:
            if not self._closed:
                await self.call(close())

    @property
    def engine_settings(self) -> dict[str, Any]:
        """The scheduler and graph settings vLLM resolved for this engine."""
        return frontend.engine_settings(self._llm)

    @property
    def block_size(self) -> int:
        """Tokens per KV block of the engine (the prefix cache's granularity)."""
        return frontend.block_size(self._llm)

    @property
    def kv_cache_blocks(self) -> int:
        """KV blocks vLLM allocated for the engine (its CPU engine: ``kv_cache_gb`` of them)."""
        return frontend.kv_cache_blocks(self._llm)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    # -- requests ------------------------------------------------------------------------

    async def stream(self, token_ids: list[int], *, max_tokens: int, temperature: float = 0.0,
                     params: RequestParams | None = None, user: str | None = None,
                     stop: list[str] | None = None, logprobs: int | None = None,
                     seed: int | None = None, ignore_eos: bool = False,
                     structured_outputs: dict[str, Any] | None = None,
                     skip_special_tokens: bool = True,
                     **sampling_options: float) -> AsyncIterator[Delta]:
        """Generate from ``token_ids``; yield text deltas, then the :class:`Completion`.

        Every request that reaches vLLM is built here, with the prefix-cache salt of
        :func:`request_salt` (``user``: who asks, for a request without ``params``).
        ``sampling_options``: ``top_p``, ``top_k``, ``presence_penalty``,
        ``frequency_penalty`` (checked by :func:`~inferscale_memory.options.check_options`).
        ``structured_outputs``: keyword arguments of vLLM's ``StructuredOutputsParams``
        (guided decoding; the same fields in vLLM 0.26 and 0.32); a ``json`` or
        ``json_object`` one is sent as its grammar, JSON written with ``", "`` and ``": "``
        and no other whitespace (:mod:`inferscale_memory.driver.guided_json`).

        Raises:
            RequestFailedError: vLLM ended the request as an error (``finish_reason``
                "error"), after the text it had streamed, or its ``generate`` failed it.
            EngineDiedError: vLLM's engine core died (see :func:`engine_failures`).
        """
        extra = {"kv_transfer_params": params.to_dict()} if params is not None else None
        if structured_outputs is not None:
            structured_outputs = await guided_json.as_grammar(structured_outputs)
        sampling = frontend.delta_sampling_params(
            max_tokens=max_tokens, temperature=temperature, stop=stop, logprobs=logprobs,
            seed=seed, extra_args=extra, ignore_eos=ignore_eos, detokenize=self.detokenize,
            skip_special_tokens=skip_special_tokens, structured_outputs=structured_outputs,
            **sampling_options)
        prompt: dict[str, Any] = {"prompt_token_ids": list(token_ids),
                                  "cache_salt": request_salt(user, params)}
        done = Completion(logprobs=[] if logprobs else None)
        start = time.perf_counter()
        request_id = f"ism-{next(self._ids)}"
        with engine_failures(f"request {request_id}"):
            async for out in self._llm.generate(prompt, sampling, request_id):
                piece = out.outputs[0]
                if piece.token_ids and not done.token_ids:
                    done.ttft_s = time.perf_counter() - start
                done.token_ids.extend(piece.token_ids)
                done.text += piece.text or ""
                if logprobs and piece.logprobs:
                    done.logprobs.extend({t: lp.logprob for t, lp in step.items()}  # type: ignore[union-attr]
                                         for step in piece.logprobs)
                if out.finished:
                    done.latency_s = time.perf_counter() - start
                    done.num_cached_tokens = out.num_cached_tokens or 0
                    done.report = ConnectorReport.from_output(out.kv_transfer_params)
                    done.finish_reason = piece.finish_reason
                ended = out.finished and done.finish_reason != "error"
                if piece.text or ended:
                    yield Delta(piece.text, done if ended else None)
        # Raised once vLLM's generator has ended (its last output is the finished one):
        # raising inside the loop would leave it to be closed later, aborting a request
        # that is already over.
        if done.finish_reason == "error":
            raise request_failed(f"request {request_id}", "vLLM ended it with finish_reason "
                                 "\"error\" (its engine core could not prepare or run it; "
                                 "vLLM's log says why)")

    async def complete(self, token_ids: list[int], **kwargs: Any) -> Completion:
        """Generate from ``token_ids`` and return the whole :class:`Completion`."""
        completion = None
        async for delta in self.stream(token_ids, **kwargs):
            completion = delta.completion or completion
        if completion is None:
            raise EngineError("the engine finished a request without output")
        return completion

    async def control(self, token_ids: list[int], params: RequestParams) -> ConnectorReport:
        """Send a capture or evict request (one output token); return its report."""
        completion = await self.complete(token_ids, max_tokens=1, params=params)
        return completion.report

    @property
    def healthy(self) -> bool:
        """Whether vLLM serves: started, not closed, its engine process not failed."""
        return (not self._closed and self._llm is not None
                and not frontend.is_errored(self._llm))

    def unfinished_requests(self) -> int:
        """Requests vLLM holds now (waiting or generating), captures included."""
        return frontend.unfinished_requests(self._llm)

    async def reset_prefix_cache(self) -> None:
        """Forget vLLM's prefix cache (benchmarks and tests use it for fresh prefills)."""
        with engine_failures("resetting the prefix cache"):
            await self._llm.reset_prefix_cache()

    # -- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """Shut the engine down (idempotent): requests in flight fail with
        :class:`EngineClosedError`, vLLM's processes exit, nothing is logged but errors."""
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        failed = frontend.is_errored(self._llm)
        try:
            # vLLM cancels its output handler only after its engine process is gone, and
            # the handler logs that death as an error: stop it first. Then the requests in
            # flight: their waits fail with EngineClosedError, vLLM aborts them.
            self._on_loop(frontend.stop_output_handler(self._llm))
            self._on_loop(self._cancel_tasks())
            frontend.shutdown(self._llm, timeout=SHUTDOWN_TIMEOUT_S)
        finally:
            # Drop vLLM's engine now: its __del__ shuts down again, which fails if it
            # runs during interpreter teardown (vLLM 0.32).
            self._llm = None
            self._stop_loop()
            self._remove_socket_folder()  # vLLM's processes are gone
            for future in list(self._pending):  # if the loop could not finish them
                if not future.done():
                    future.set_exception(EngineClosedError("the engine was closed"))
            self._log.close(failed=failed)

    def _remove_socket_folder(self) -> None:
        """Remove the sockets vLLM leaves behind, with their folder."""
        if self.socket_folder is not None:
            shutil.rmtree(self.socket_folder, ignore_errors=True)

    def _on_loop(self, coro: Coroutine[Any, Any, None], timeout: float = 10) -> None:
        """Run ``coro`` on the engine loop and wait (best effort: close() goes on)."""
        if not self._loop.is_running():
            coro.close()
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_loop(self) -> None:
        self._on_loop(self._cancel_tasks())  # no task is left pending at exit
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


async def refusing_bad_schemas(deltas: AsyncIterator[Delta], param: str
                               ) -> AsyncIterator[Delta]:
    """``deltas`` of a guided request, with vLLM's failure on the schema of ``param`` (the
    parameter that guides it, :attr:`~inferscale_memory.tools.ToolRequest.guided_param`)
    raised as :class:`~inferscale_memory.errors.SchemaError`: the client's mistake, and
    vLLM goes on serving. vLLM fails a schema in three places:

    - when the request is submitted (a feature its guided decoding does not support);
    - when the engine core compiles the grammar (off its scheduling loop), or
    - when the grammar admits no token the sampler could pick (``{"$ref": "#"}`` compiles
      to a grammar that admits nothing): vLLM 0.32 ends the request with ``finish_reason``
      "error" (its engine log says "grammar rejected tokens"), empty text.

    The last two reach here as :class:`~inferscale_memory.errors.RequestFailedError` (the
    runtime's rule for any request vLLM ends as an error).
    """
    try:
        try:
            delta = await anext(deltas)
        except frontend.request_validation_errors() as exc:
            raise SchemaError(f"{param}: this JSON schema cannot be used for guided decoding: "
                              f"{exc}", param) from exc
        while True:
            yield delta
            delta = await anext(deltas)
    except StopAsyncIteration:
        return
    except RequestFailedError as exc:
        if exc.__cause__ is not None:  # vLLM's generate raised: not the grammar's doing
            raise
        raise SchemaError(f"{param}: guided decoding failed on this JSON schema: the engine "
                          "could not compile its grammar, or the grammar admits no answer "
                          "(e.g. a $ref that refers only to itself); simplify it",
                          param) from exc
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]


@contextlib.contextmanager
def engine_failures(what: str) -> Iterator[None]:
    """vLLM's errors of ``what`` (a request, a call of vLLM) that the engine caused, not
    the caller's input, raised as the library's, vLLM's chained: ``EngineDeadError`` (its
    engine core died) as :class:`~inferscale_memory.errors.EngineDiedError`, and
    ``EngineGenerateError`` (``generate`` failed this request, vLLM serves on) as
    :class:`~inferscale_memory.errors.RequestFailedError`."""
    try:
        yield
    except frontend.engine_errors() as exc:
        if frontend.is_engine_dead(exc):
            raise EngineDiedError(
                f"vLLM's engine core died ({what} failed): the engine answers nothing more "
                "(vLLM's log says why: killed, out of memory, a crash); close it and start a "
                "new MemoryEngine (a server: restart it), the facts are kept") from exc
        cause = exc.__cause__ or exc
        raise request_failed(what, f"vLLM's generate raised {type(cause).__name__}: "
                             f"{cause}") from exc


def request_failed(what: str, how: str) -> RequestFailedError:
    """The error of a request that vLLM failed while it serves on."""
    return RequestFailedError(f"the engine failed {what}: {how}; the engine goes on serving "
                              "other requests: send it again, and report it if it recurs")


def _close_open_runtimes_at_exit() -> None:
    """Have engines still open when the interpreter exits shut down like ``close()``.

    Registered once, after vLLM started its first engine: exit hooks run last-registered
    first, so this one runs before vLLM's own finalizers would kill the engine process
    under a live output handler."""
    global _exit_hook
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_close_open_runtimes)


def _close_open_runtimes() -> None:
    for runtime in list(_open):
        with contextlib.suppress(Exception):
            runtime.close()


def engine_arguments(model_path: Path, config: MemoryConfig, *, connector: bool = True
                     ) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` keywords of an engine on ``model_path``: the package's
    settings, then the user's ``config.engine_args`` over them. ``connector=False``: plain
    vLLM with the same arguments (:class:`VllmRuntime`)."""
    from inferscale_memory.connector import kv_transfer_config

    args = dict(
        model=str(model_path),
        max_model_len=config.max_model_len,  # None: the model's own context
        dtype=config.dtype,
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        tensor_parallel_size=config.tensor_parallel_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        enable_prefix_caching=True,
        structured_outputs_config=frontend.structured_outputs_config(),
        **frontend.front_end_settings(),
        **frontend.graph_settings(config.engine_args, cuda=sizing.cuda_build()),
    )
    if connector:
        args["kv_transfer_config"] = kv_transfer_config(
            {"pool_bytes": int(config.kv_pool_gb * (1 << 30)),
             "host_pool_bytes": int(config.kv_host_pool_gb * (1 << 30))})
    args.update(config.engine_args)
    return args


def request_salt(user: str | None, params: RequestParams | None) -> str:
    """The prefix-cache salt of a request: vLLM shares cached blocks only between requests
    with the same salt, so every request names who sent it, and its kind.

    - A request that injects facts: its user and prompt layout (the connector checks it).
      Injected (approximate) blocks are reused only by such requests of that user.
    - A capture or evict request: its user, as ``capture``. Its exact blocks hold the
      user's fact text and are reused only by the user's other captures.
    - A plain prompt (the text path, memory off, a user without facts): ``user``. One that
      names no user has a salt of its own: two callers that name none share nothing (a
      caller that wants its requests to share blocks names a user, e.g.
      ``chat(user_id=..., memory=False)``; the server names the API key).
    """
    if params is None:
        return cache_salt(user, "text") if user else f"inferscale-own-{secrets.token_hex(20)}"
    if params.inject:
        return cache_salt(params.user, params.layout)
    return cache_salt(params.user, f"capture:{params.layout}")

"""``POST /v1/chat/completions``: OpenAI-compatible answers with the user's memory.

Handlers run on the engine's event loop and await :meth:`MemoryEngine.astream_chat`
directly. A streamed answer's first piece is awaited before the response starts, so
request errors (bad messages, context too long) still get a proper status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.markup import ashown_stream, shown
from inferscale_memory.results import ChatChunk, ChatResult
from inferscale_memory.server.context import ServerContext, context, principal, request_user
from inferscale_memory.server.errors import (
    APIError,
    ClientDisconnected,
    ErrorResponseDoc,
    log_failure,
    sse_error,
)
from inferscale_memory.server.schemas import (
    MAX_K,
    MAX_MESSAGES,
    MEMORY_FIELDS,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    ChunkFunctionCall,
    ChunkToolCall,
    MemoryOptions,
    MemoryReport,
    PromptTokensDetails,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    Usage,
)
from inferscale_memory.tools import ToolCallDelta

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=ChatCompletion,
             responses={**ErrorResponseDoc, 200: {
                 "content": {"text/event-stream": {}},
                 "description": "The answer; with stream=true, chat.completion.chunk events"}})
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    """Answer a conversation, with the ``user``'s facts injected as KV (``memory.mode``)."""
    ctx = context(request)
    ctx.check_model(body.model)
    ctx.check_max_tokens(body.max_tokens, "max_tokens")
    ctx.check_max_tokens(body.max_completion_tokens, "max_completion_tokens")
    call = _Call.prepare(ctx, body, request_user(request, body.user, required=False),
                         principal(request).salt_user)
    if body.stream:
        return await call.stream(body)
    with _memory_named():
        result = shown(await _unless_gone(request,
                                          ctx.engine.achat(call.messages, **call.kwargs)))
    call.observe(result)
    return ChatCompletion(
        id=call.id, created=call.created, model=ctx.model_name,
        choices=[Choice(message=_message(result),
                        finish_reason=result.finish_reason,
                        logprobs=call.logprobs(result))],
        usage=_usage(result), memory=call.report(result))


@contextlib.contextmanager
def _memory_named() -> Iterator[None]:
    """Name the engine's refusal of a memory option as the request does: ``k`` is
    ``memory.k`` there (:data:`MEMORY_FIELDS`); other refusals name the request's field."""
    try:
        yield
    except InvalidInputError as exc:
        if exc.param not in MEMORY_FIELDS:
            raise
        raise InvalidInputError(f"memory.{exc}", f"memory.{exc.param}") from None


async def _unless_gone(request: Request, answer: Coroutine[Any, Any, ChatResult]) -> ChatResult:
    """Await ``answer``, cancelling it (vLLM aborts the request) if the client disconnects
    first: nobody would read it, and it would hold the engine up to ``max_tokens``."""
    task = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()  # takes effect at the task's next step: wait for it
            await asyncio.wait((task,))
    if task in done:
        return task.result()
    if not task.cancelled():
        task.exception()  # the failure of an answer nobody reads is not logged
    raise ClientDisconnected


async def _disconnected(request: Request) -> None:
    """Return when the client has gone away (the body is read: only ``http.disconnect``
    can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Call:
    """One chat request turned into engine arguments."""

    def __init__(self, ctx: ServerContext, body: ChatCompletionRequest, user: str | None,
                 salt_user: str) -> None:
        options = body.memory or MemoryOptions(k=None)
        self.ctx = ctx
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.user = user
        self.mode = options.mode if user is not None else "off"
        self.k = options.k or ctx.engine.config.k
        self.top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
        self.messages = body.messages  # the engine checks them (and the engine's fields)
        kwargs: dict[str, Any] = {  # a user without facts yet: the engine answers plainly
            # vLLM's prefix cache is shared within user_id: a chat that names no user is
            # answered without memory for its API key (auth.Principal.salt_user)
            "user_id": user if user is not None else salt_user,
            "memory": self.mode != "off", "k": options.k,
            "mode": "text" if self.mode == "off" else self.mode,
            "fact_order": options.fact_order, "recompute_tail": options.recompute_tail,
            "logprobs": max(1, self.top_logprobs) if self.top_logprobs is not None else None,
            **body.engine_options(),
        }
        self.kwargs = {key: value for key, value in kwargs.items()
                       if value is not None or key == "user_id"}

    @classmethod
    def prepare(cls, ctx: ServerContext, body: ChatCompletionRequest,
                user: str | None, salt_user: str) -> _Call:
        if body.functions:
            raise APIError(400, "functions are not supported by this server; send tools",
                           param="functions", code="unsupported_parameter")
        if body.logit_bias:
            raise APIError(400, "logit_bias is not supported by this server",
                           param="logit_bias", code="unsupported_parameter")
        if body.stream and body.logprobs:
            raise APIError(400, "logprobs are only supported without stream",
                           param="logprobs", code="unsupported_parameter")
        if isinstance(body.messages, list) and len(body.messages) > MAX_MESSAGES:
            raise APIError(400, f"messages: at most {MAX_MESSAGES} messages; got "
                           f"{len(body.messages)}", param="messages", code="invalid_value")
        for name in ("k", "recompute_tail"):  # the server's bound; the engine checks the rest
            value = getattr(body.memory, name, None)
            if type(value) is int and value > MAX_K:
                raise APIError(400, f"memory.{name}: Input should be less than or equal to "
                               f"{MAX_K}; got {value}", param=f"memory.{name}",
                               code="invalid_value")
        return cls(ctx, body, user, salt_user)

    def observe(self, result: ChatResult) -> None:
        self.ctx.metrics.observe_chat(result.metrics, self.mode)

    def report(self, result: ChatResult) -> MemoryReport:
        m = result.metrics
        k = None if self.mode == "off" else self.k
        return MemoryReport(user=self.user, mode=self.mode, k=k, memory_used=m.memory_used,
                            fact_ids=m.fact_ids, recomputed_fact_ids=m.recomputed_fact_ids,
                            ttft_ms=round(m.ttft_ms, 3), retrieval_ms=round(m.retrieval_ms, 3))

    def logprobs(self, result: ChatResult) -> ChoiceLogprobs | None:
        if self.top_logprobs is None or result.logprobs is None:
            return None
        tokenizer = self.ctx.engine.tokenizer
        content = []
        for token_id, step in zip(result.token_ids, result.logprobs, strict=False):
            ranked = sorted(step.items(), key=lambda item: -item[1])[:self.top_logprobs]
            tops = [_top(tokenizer, tid, lp) for tid, lp in ranked]
            chosen = _top(tokenizer, token_id, step.get(token_id, float("-inf")))
            content.append(TokenLogprob(**chosen.model_dump(), top_logprobs=tops))
        return ChoiceLogprobs(content=content)

    async def stream(self, body: ChatCompletionRequest) -> StreamingResponse:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        pieces = ashown_stream(self.ctx.engine.astream_chat(self.messages, **self.kwargs))
        try:
            with _memory_named():
                first = await pieces.__anext__()  # request errors surface here, as a status
        except StopAsyncIteration as exc:
            raise APIError(500, "the engine returned no answer", type="server_error") from exc
        except APIError:
            await pieces.aclose()  # type: ignore[attr-defined]
            raise
        return StreamingResponse(self._events(first, pieces, include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})

    async def _events(self, first: ChatChunk, pieces: AsyncIterator[ChatChunk],
                      include_usage: bool) -> AsyncIterator[bytes]:
        try:
            yield self._chunk([ChunkChoice(delta=ChunkDelta(role="assistant", content=""))])
            chunk: ChatChunk | None = first
            while chunk is not None:
                if chunk.text or chunk.tool_calls:
                    yield self._chunk([ChunkChoice(delta=ChunkDelta(
                        content=chunk.text or None, tool_calls=_tool_deltas(chunk.tool_calls)))])
                if chunk.result is not None:
                    for event in self._finish(chunk.result, include_usage):
                        yield event
                chunk = await anext(pieces, None)  # type: ignore[call-overload]
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # headers are sent: report in-band
            log_failure(f"streamed answer {self.id}", exc)
            yield sse_error(exc)
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]

    def _finish(self, result: ChatResult, include_usage: bool) -> list[bytes]:
        """The finishing chunk (finish reason, memory report) and the usage chunk."""
        self.observe(result)
        events = [self._chunk([ChunkChoice(delta=ChunkDelta(), finish_reason=result.finish_reason)],
                              memory=self.report(result))]
        if include_usage:
            events.append(self._chunk([], usage=_usage(result)))
        return events

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> bytes:
        chunk = ChatCompletionChunk(id=self.id, created=self.created,
                                    model=self.ctx.model_name, choices=choices, **extra)
        skip = {"memory"} if chunk.memory is None else None
        return f"data: {chunk.model_dump_json(exclude=skip)}\n\n".encode()


def _message(result: ChatResult) -> AssistantMessage:
    if not result.tool_calls:
        return AssistantMessage(content=result.text)
    return AssistantMessage(content=result.text or None,
                            tool_calls=[ToolCall(**call.to_dict()) for call in result.tool_calls])


def _tool_deltas(deltas: list[ToolCallDelta]) -> list[ChunkToolCall] | None:
    """OpenAI's streamed tool-call shape: the first piece of a call has its id and name."""
    if not deltas:
        return None
    return [ChunkToolCall(index=d.index, id=d.id, type="function" if d.id else None,
                          function=ChunkFunctionCall(name=d.name, arguments=d.arguments))
            for d in deltas]


def _usage(result: ChatResult) -> Usage:
    m = result.metrics
    return Usage(prompt_tokens=m.prompt_tokens, completion_tokens=m.output_tokens,
                 total_tokens=m.prompt_tokens + m.output_tokens,
                 injected_tokens=m.injected_tokens, computed_prompt_tokens=m.computed_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=m.cached_tokens))


def _top(tokenizer: Any, token_id: int, logprob: float) -> TopLogprob:
    text = tokenizer.decode([token_id])
    return TopLogprob(token=text, logprob=max(logprob, -9999.0),
                      bytes=list(text.encode("utf-8")))

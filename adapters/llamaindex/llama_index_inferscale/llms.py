"""InferScaleLLM: a LlamaIndex LLM whose answers get the user's facts injected as KV."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from inferscale_memory import ChatChunk, ChatResult, MemoryEngine
from inferscale_memory.integrations import (
    TOOL_CHOICES,
    TOOL_KEYS,
    ashown_stream,
    call_arguments,
    default_engine,
    shown,
    shown_stream,
)
from llama_index_inferscale.handover import FactsMessage, handed_facts

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

# Sampling parameters, as constructor fields and call keywords (checked by the engine).
SAMPLING = ("temperature", "max_tokens", "seed", "top_p", "top_k", "presence_penalty",
            "frequency_penalty", "stop")
# Per-call keywords besides sampling and tools, each defaulting to the field of its name.
CALL_OPTIONS = ("mode", "timeout")
ROLES = {MessageRole.SYSTEM: "system", MessageRole.USER: "user",
         MessageRole.ASSISTANT: "assistant", MessageRole.DEVELOPER: "system",
         MessageRole.TOOL: "tool"}


class InferScaleLLM(FunctionCallingLLM):
    """LLM on an inferscale-memory engine: the user's facts are injected as KV.

    Facts come from an :class:`~llama_index_inferscale.InferScaleMemoryBlock` in the
    chat's ``Memory`` (its message is taken out of the conversation: the facts' KV is
    injected instead of their text), or, when there is none, from the engine's own
    retrieval for ``user_id``.

    Example:
        .. code-block:: python

            from inferscale_memory import MemoryEngine
            from llama_index_inferscale import InferScaleLLM

            engine = MemoryEngine()
            engine.memory.add("Caroline moved to Berlin.", user_id="caroline")
            llm = InferScaleLLM(engine=engine, user_id="caroline")
            response = llm.chat([ChatMessage(role="user", content="Where is Caroline?")])
            response.message.content, response.additional_kwargs["memory"]["injected_tokens"]

    Tools (``chat_with_tools``, ``predict_and_call``, ``FunctionAgent``), on any model (a
    chat template without tools, such as the embedded SmolLM2's, gets the engine's own tool
    prompt; ``engine.tool_parser = None`` turns tools off): the calls come back in
    ``message.additional_kwargs["tool_calls"]`` (OpenAI's shape), read by
    :meth:`get_tool_calls_from_response`; the facts are injected all the same.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    engine: Any = Field(default=None, exclude=True,
                        description="The MemoryEngine; None shares a default engine.")
    model: str | None = Field(default=None, description=(
        "Model folder for the default engine when `engine` is not given (None: the "
        "embedded SmolLM2-135M-Instruct)."))
    user_id: str | None = Field(default=None, description=(
        "Whose facts to retrieve when no memory block hands facts over."))
    k: int | None = Field(default=None, description="Facts retrieved per call.")
    mode: Literal["kv", "text"] = Field(default="kv", description=(
        "'kv' injects the facts' KV; 'text' prefills the same tokens (A/B)."))
    temperature: float = Field(default=0.0)
    max_tokens: int | None = Field(default=None)
    seed: int | None = Field(default=None)
    top_p: float | None = Field(default=None)
    top_k: int | None = Field(default=None, description="vLLM's top-k (0: every token).")
    presence_penalty: float | None = Field(default=None)
    frequency_penalty: float | None = Field(default=None)
    stop: list[str] | None = Field(default=None)
    timeout: float | None = Field(default=None, description=(
        "Seconds a call may take, streams included (to their last chunk); past them the "
        "request is cancelled and TimeoutError raised. None waits."))
    context_window: int | None = Field(default=None, description=(
        "Reported to LlamaIndex; None: the engine's context (its max_model_len)."))

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleLLM"

    @property
    def metadata(self) -> LLMMetadata:
        # LlamaIndex sizes memories and prompts from context_window (CondensePlusContext's
        # Memory takes context_window - 256 tokens), so it is the engine's, not a guess.
        engine = self._engine()
        return LLMMetadata(
            context_window=self.context_window or engine.max_model_len,
            num_output=self.max_tokens or 128, is_chat_model=True,
            is_function_calling_model=engine.tool_parser is not None,
            model_name=engine.model_name)

    # -- chat -----------------------------------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        engine, request = self._request(messages, kwargs)
        return _chat_response(shown(engine.chat(**request)))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        engine, request = self._request(messages, kwargs)
        return _chat_stream(shown_stream(engine.stream_chat(**request)))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        engine, request = self._request(messages, kwargs)
        return _chat_response(shown(await engine.achat(**request)))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage],
                           **kwargs: Any) -> ChatResponseAsyncGen:
        engine, request = self._request(messages, kwargs)

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for piece in ashown_stream(engine.astream_chat(**request)):
                text += piece.text
                yield _chat_piece(text, piece)

        return gen()

    # -- tools ----------------------------------------------------------------------------

    def _prepare_chat_with_tools(
            self, tools: Sequence[BaseTool], user_msg: str | ChatMessage | None = None,
            chat_history: list[ChatMessage] | None = None, verbose: bool = False,
            allow_parallel_tool_calls: bool = False, tool_required: bool = False,
            tool_choice: str | dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """The ``chat`` keywords of a call with ``tools``: ``tool_required`` makes a call
        required, ``tool_choice`` may name one tool."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(_user(user_msg) if isinstance(user_msg, str) else user_msg)
        if not tools:
            return {"messages": messages, **kwargs}
        if tool_choice is None:
            tool_choice = "required" if tool_required else "auto"
        elif isinstance(tool_choice, str) and tool_choice not in TOOL_CHOICES:
            tool_choice = {"type": "function", "function": {"name": tool_choice}}
        return {"messages": messages, "tools": [t.metadata.to_openai_tool() for t in tools],
                "tool_choice": tool_choice, "parallel_tool_calls": allow_parallel_tool_calls,
                **kwargs}

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        """The tool calls of a response (arguments that are no JSON object become ``{}``).

        Raises:
            ValueError: No call, and ``error_on_no_tool_call``.
        """
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not calls and error_on_no_tool_call:
            raise ValueError(f"expected at least one tool call; got {len(calls)}")
        return [ToolSelection(tool_id=call["id"], tool_name=call["function"]["name"],
                              tool_kwargs=call_arguments(call["function"]["arguments"]) or {})
                for call in calls]

    # -- completion: the prompt is one user message ----------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _as_completion(self.chat([_user(prompt)], **kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        return (_as_completion(r) for r in self.stream_chat([_user(prompt)], **kwargs))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponse:
        return _as_completion(await self.achat([_user(prompt)], **kwargs))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        responses = await self.astream_chat([_user(prompt)], **kwargs)

        async def gen() -> CompletionResponseAsyncGen:
            async for response in responses:
                yield _as_completion(response)

        return gen()

    # -- helpers --------------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage],
                 kwargs: dict[str, Any]) -> tuple[MemoryEngine, dict[str, Any]]:
        handed, conversation = _split_memory(messages)
        options = {key: kwargs.pop(key, getattr(self, key)) for key in (*SAMPLING, *CALL_OPTIONS)}
        options.update({key: kwargs.pop(key) for key in TOOL_KEYS if key in kwargs})
        if handed is not None:  # facts from InferScaleMemoryBlock: no retrieval here
            kwargs.pop("user_id", None)
            kwargs.pop("k", None)
            user_id, facts = handed_facts(handed)
            options.update(user_id=user_id, facts=facts)
        else:
            options.update(user_id=kwargs.pop("user_id", self.user_id),
                           k=kwargs.pop("k", self.k))
        if kwargs:
            known = {*SAMPLING, *TOOL_KEYS, *CALL_OPTIONS, "user_id", "k"}
            raise ValueError(f"InferScaleLLM got unknown call options {sorted(kwargs)}; it "
                             f"takes {sorted(known)}")
        engine = self._engine()
        request = {"messages": conversation,
                   **{key: value for key, value in options.items() if value is not None}}
        return engine, request

    def _engine(self) -> MemoryEngine:
        return self.engine if self.engine is not None else default_engine(self.model)


def _split_memory(messages: Sequence[ChatMessage]
                  ) -> tuple[FactsMessage | None, list[dict[str, Any]]]:
    """Take the memory block's hand-over message out; the rest as OpenAI-style dicts."""
    handed = None
    conversation = []
    for message in messages:
        if isinstance(message, FactsMessage):
            handed = message
            continue
        role = ROLES.get(message.role)
        if role is None:
            raise ValueError(f"InferScaleLLM cannot take {message.role.value!r} messages: "
                             "only system, user, assistant and tool")
        entry: dict[str, Any] = {"role": role, "content": message.content or ""}
        extra = message.additional_kwargs
        if role == "assistant" and extra.get("tool_calls"):
            entry["tool_calls"] = [_openai_call(call) for call in extra["tool_calls"]]
        if role == "tool":
            entry["tool_call_id"] = extra.get("tool_call_id")
        conversation.append(entry)
    return handed, conversation


def _openai_call(call: Any) -> dict[str, Any]:
    """A tool call of an earlier assistant message in OpenAI's shape (a dict, or an object
    with ``model_dump``, such as the ``openai`` package's)."""
    return call.model_dump() if hasattr(call, "model_dump") else dict(call)


def _memory(result: ChatResult) -> dict[str, Any]:
    return dataclasses.asdict(result.metrics)


def _assistant(text: str, result: ChatResult | None) -> ChatMessage:
    """The answer's message; its tool calls in ``additional_kwargs``, as OpenAI's LLM puts
    them (and as :func:`_split_memory` reads them back)."""
    calls = [call.to_dict() for call in result.tool_calls] if result is not None else []
    return ChatMessage(role=MessageRole.ASSISTANT, content=text,
                       additional_kwargs={"tool_calls": calls} if calls else {})


def _chat_response(result: ChatResult) -> ChatResponse:
    return ChatResponse(message=_assistant(result.text, result), raw=result,
                        additional_kwargs={"memory": _memory(result)})


def _chat_piece(text: str, piece: ChatChunk) -> ChatResponse:
    extra = {"memory": _memory(piece.result)} if piece.result is not None else {}
    return ChatResponse(message=_assistant(text, piece.result), delta=piece.text,
                        raw=piece.result, additional_kwargs=extra)


def _chat_stream(pieces: Iterator[ChatChunk]) -> ChatResponseGen:
    text = ""
    for piece in pieces:
        text += piece.text
        yield _chat_piece(text, piece)


def _as_completion(response: ChatResponse) -> CompletionResponse:
    return CompletionResponse(text=response.message.content or "", delta=response.delta,
                              raw=response.raw, additional_kwargs=response.additional_kwargs)


def _user(prompt: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, content=prompt)



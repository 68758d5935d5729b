"""ChatInferScale: a LangChain chat model whose answers get the user's facts injected as KV."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, SecretStr

from inferscale_memory import ChatChunk, MemoryEngine
from inferscale_memory import ChatResult as MemoryResult
from inferscale_memory.integrations import achat_within, default_engine
from langchain_inferscale.injection import afacts_for, facts_for, without_memory

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MEMORY_KEYS = ("user_id", "k", "mode")
# Sampling parameters, as constructor fields and call keywords (checked by the engine).
SAMPLING = ("temperature", "max_tokens", "seed", "top_p", "top_k", "presence_penalty",
            "frequency_penalty")
ROLES = {"system": "system", "human": "user", "ai": "assistant"}
NO_TOOLS = (
    "ChatInferScale does not support tool calling: the inferscale engine renders only "
    "system, user and assistant messages and parses no tool calls (the embedded "
    "SmolLM2-135M-Instruct chat template has no tools section). Use a graph without tools, "
    "or a tool-calling chat model for the agent and ChatInferScale for the answers."
)


class ChatInferScale(BaseChatModel):
    """Chat model on an inferscale-memory engine: the user's facts are injected as KV.

    Each call retrieves ``user_id``'s top-``k`` facts for the last user message and has
    the engine inject their precomputed KV instead of prefilling their text.

    Setup:
        .. code-block:: bash

            pip install langchain-inferscale

    Instantiate:
        .. code-block:: python

            from inferscale_memory import MemoryEngine
            from langchain_inferscale import ChatInferScale

            engine = MemoryEngine()
            engine.memory.add("Caroline moved to Berlin in May 2023.", user_id="caroline")
            llm = ChatInferScale(engine=engine, user_id="caroline", k=10, max_tokens=64)

    Invoke:
        .. code-block:: python

            msg = llm.invoke("Where does Caroline live?")
            msg.content                                   # the answer
            msg.response_metadata["memory"]["injected_tokens"]

    Per-call memory:
        .. code-block:: python

            llm.invoke("Where do I live?", config={"configurable": {"user_id": "bob"}})

    Stream / async / batch: ``stream``, ``astream``, ``ainvoke``, ``batch``, ``abatch``.

    Facts whose text the prompt already holds (e.g. pasted by an
    :class:`~langchain_inferscale.InferScaleRetriever` chain) are not injected again:
    ``response_metadata["memory"]["skipped_in_prompt"]`` lists them.

    Tool calling is not supported: :meth:`bind_tools` raises ``NotImplementedError``.
    """

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True,
                              extra="forbid")  # an unknown parameter is an error, not ignored

    engine: Any = Field(default=None, exclude=True)
    """The :class:`~inferscale_memory.MemoryEngine`; ``None`` shares a default engine."""
    model_name: str | None = Field(default=None, alias="model")
    """Model folder for the default engine when ``engine`` is not given (``None``: the
    embedded SmolLM2-135M-Instruct)."""
    user_id: str | None = None
    """Whose facts to inject; ``None`` answers without memory."""
    k: int | None = None
    """Facts retrieved per call (default: the engine's ``config.k``)."""
    mode: Literal["kv", "text"] = "kv"
    """``"kv"`` injects the facts' KV; ``"text"`` prefills the same tokens (A/B)."""
    temperature: float = 0.0
    max_tokens: int | None = None
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    seed: int | None = None
    top_p: float | None = None
    top_k: int | None = None
    """vLLM's top-k (0: every token)."""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    timeout: float | None = None
    """Seconds a call may take; ``None`` waits."""
    max_retries: int = 0
    """LangChain's standard parameter; the engine runs in process, so nothing is retried."""
    api_key: SecretStr | None = None
    """LangChain's standard parameter; an in-process engine needs no key (unused)."""
    streaming: bool = False

    @property
    def _llm_type(self) -> str:
        return "inferscale-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self._model_label, "mode": self.mode, "k": self.k,
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    @property
    def _model_label(self) -> str:
        if self.engine is not None:
            return str(self.engine.model_path.name)
        return self.model_name or DEFAULT_MODEL_NAME

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="inferscale", ls_model_type="chat",
            ls_model_name=kwargs.get("model") or self._model_label,
            ls_temperature=kwargs.get("temperature", self.temperature))
        if (max_tokens := kwargs.get("max_tokens", self.max_tokens)) is not None:
            params["ls_max_tokens"] = max_tokens
        if stop := stop or self.stop:
            params["ls_stop"] = stop
        return params

    # -- per-call memory from config={"configurable": {...}} ------------------------------

    def invoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> AIMessage:
        return super().invoke(input, config, stop=stop, **_from_config(config, kwargs))

    async def ainvoke(self, input: LanguageModelInput, config: RunnableConfig | None = None,
                      *, stop: list[str] | None = None, **kwargs: Any) -> AIMessage:
        return await super().ainvoke(input, config, stop=stop, **_from_config(config, kwargs))

    def stream(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> Iterator[AIMessageChunk]:
        yield from super().stream(input, config, stop=stop, **_from_config(config, kwargs))

    async def astream(self, input: LanguageModelInput, config: RunnableConfig | None = None,
                      *, stop: list[str] | None = None,
                      **kwargs: Any) -> AsyncIterator[AIMessageChunk]:
        async for chunk in super().astream(input, config, stop=stop,
                                           **_from_config(config, kwargs)):
            yield chunk

    # -- generation -----------------------------------------------------------------------

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        engine, request = self._request(messages, stop, kwargs)
        skipped = facts_for(engine, request)
        result = engine.arun(achat_within(engine, request, self.timeout))
        return self._chat_result(engine, result, request["user_id"], skipped)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        engine, request = self._request(messages, stop, kwargs)
        skipped = await afacts_for(engine, request)
        result = await achat_within(engine, request, self.timeout)
        return self._chat_result(engine, result, request["user_id"], skipped)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        engine, request = self._request(messages, stop, kwargs)
        skipped = facts_for(engine, request)
        for piece in engine.stream_chat(**request):
            chunk = self._chunk(engine, piece, request["user_id"], skipped)
            if run_manager and piece.text:
                run_manager.on_llm_new_token(piece.text, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        engine, request = self._request(messages, stop, kwargs)
        skipped = await afacts_for(engine, request)
        async for piece in engine.astream_chat(**request):
            chunk = self._chunk(engine, piece, request["user_id"], skipped)
            if run_manager and piece.text:
                await run_manager.on_llm_new_token(piece.text, chunk=chunk)
            yield chunk

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable | BaseTool],
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Not supported: raises ``NotImplementedError`` (the engine parses no tool calls)."""
        raise NotImplementedError(NO_TOOLS)

    # -- helpers --------------------------------------------------------------------------

    def _engine(self) -> MemoryEngine:
        return self.engine if self.engine is not None else default_engine(self.model_name)

    def _request(self, messages: list[BaseMessage], stop: list[str] | None,
                 kwargs: dict[str, Any]) -> tuple[MemoryEngine, dict[str, Any]]:
        unknown = set(kwargs) - {*MEMORY_KEYS, *SAMPLING, "model", "stream"}
        if unknown:
            raise ValueError(f"ChatInferScale got unknown call options {sorted(unknown)}; "
                             f"it takes {sorted({*MEMORY_KEYS, *SAMPLING})}")
        options = {key: kwargs.get(key, getattr(self, key)) for key in SAMPLING}
        options["stop"] = stop if stop is not None else self.stop
        request = {"messages": _to_openai(messages),
                   "user_id": kwargs.get("user_id", self.user_id),
                   "k": kwargs.get("k", self.k), "mode": kwargs.get("mode", self.mode),
                   **{key: value for key, value in options.items() if value not in (None, [])}}
        return self._engine(), request

    def _chat_result(self, engine: MemoryEngine, result: MemoryResult, user_id: str | None,
                     skipped: list[str]) -> ChatResult:
        message = AIMessage(content=result.text, usage_metadata=_usage(result),
                            response_metadata=self._metadata(engine, result, user_id, skipped))
        return ChatResult(generations=[ChatGeneration(message=message)],
                          llm_output={"model_name": self._model_label})

    def _chunk(self, engine: MemoryEngine, piece: ChatChunk, user_id: str | None,
               skipped: list[str]) -> ChatGenerationChunk:
        if piece.result is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
        message = AIMessageChunk(content=piece.text, usage_metadata=_usage(piece.result),
                                 response_metadata=self._metadata(engine, piece.result,
                                                                  user_id, skipped),
                                 chunk_position="last")
        return ChatGenerationChunk(message=message)

    def _metadata(self, engine: MemoryEngine, result: MemoryResult, user_id: str | None,
                  skipped: list[str]) -> dict[str, Any]:
        memory = {"user_id": user_id,
                  "without_memory": without_memory(engine, result, user_id, skipped),
                  "skipped_in_prompt": skipped, **dataclasses.asdict(result.metrics)}
        return {"model_name": self._model_label, "finish_reason": result.finish_reason,
                "memory": memory}


def _from_config(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Memory options from ``config["configurable"]`` (also a parent's, e.g. LangGraph's).

    Raises:
        ValueError: A key that looks like one of ours but is not (``userid``): it would
            answer without memory and without a sign.
    """
    configurable = ensure_config(config).get("configurable", {})
    for key in configurable:
        if key not in MEMORY_KEYS and (near := _looks_like_ours(key)):
            raise ValueError(f"unknown configurable key {key!r}: did you mean {near!r}? "
                             f"ChatInferScale reads {list(MEMORY_KEYS)}")
    return {**{key: configurable[key] for key in MEMORY_KEYS if key in configurable}, **kwargs}


def _looks_like_ours(key: str) -> str | None:
    """The memory key ``key`` is probably a misspelling of, if any."""
    normal = key.lower().replace("_", "").replace("-", "")
    for ours in MEMORY_KEYS:
        if normal == ours.replace("_", "") or (normal == "user" and ours == "user_id"):
            return ours
    # Only user_id is long enough to misspell ("mode" is one letter from LangChain's "model").
    close = difflib.get_close_matches(key.lower(), ["user_id"], n=1, cutoff=0.8)
    return close[0] if close else None


def _to_openai(messages: list[BaseMessage]) -> list[dict[str, str]]:
    out = []
    for message in messages:
        role = ROLES.get(message.type) or str(getattr(message, "role", ""))
        if role not in ROLES.values():
            raise ValueError(f"ChatInferScale cannot take {message.type!r} messages: "
                             "only system, human and ai messages (no tools)")
        if isinstance(message.content, list) and any(
                not isinstance(block, str) and block.get("type") != "text"
                for block in message.content):
            raise ValueError("ChatInferScale takes text content only")
        out.append({"role": role, "content": message.text})
    return out


def _usage(result: MemoryResult) -> UsageMetadata:
    metrics = result.metrics
    return UsageMetadata(
        input_tokens=metrics.prompt_tokens, output_tokens=metrics.output_tokens,
        total_tokens=metrics.prompt_tokens + metrics.output_tokens,
        input_token_details={"cache_read": metrics.injected_tokens + metrics.cached_tokens})


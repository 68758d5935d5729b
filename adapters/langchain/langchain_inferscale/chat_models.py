"""ChatInferScale: a LangChain chat model whose answers get the user's facts injected as KV."""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ToolMessage,
    UsageMetadata,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableMap,
    RunnablePassthrough,
    ensure_config,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from inferscale_memory import ChatChunk, MemoryEngine
from inferscale_memory import ChatResult as MemoryResult
from inferscale_memory.integrations import (
    TOOL_CHOICES,
    TOOL_KEYS,
    ashown_stream,
    call_arguments,
    default_engine,
    shown,
    shown_stream,
)
from langchain_inferscale.injection import afacts_for, facts_for, without_memory

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MEMORY_KEYS = ("user_id", "k", "mode")
# Sampling parameters, as constructor fields and call keywords (checked by the engine).
SAMPLING = ("temperature", "max_tokens", "seed", "top_p", "top_k", "presence_penalty",
            "frequency_penalty")
ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


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

    Tools and structured output (on any model: a chat template without tools, such as the
    embedded SmolLM2's, gets the engine's own tool prompt):

        .. code-block:: python

            llm.bind_tools([get_weather]).invoke("Weather where I live?").tool_calls
            llm.with_structured_output(City).invoke("Where does Caroline live?")

    The facts are injected as KV all the same.
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
    """Seconds a call may take, streams included (to their last chunk); past them the
    request is cancelled and ``TimeoutError`` raised. ``None`` waits."""
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
            return str(self.engine.model_name)
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
        result = shown(engine.chat(**request))
        return self._chat_result(engine, result, request["user_id"], skipped)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        engine, request = self._request(messages, stop, kwargs)
        skipped = await afacts_for(engine, request)
        result = shown(await engine.achat(**request))
        return self._chat_result(engine, result, request["user_id"], skipped)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        engine, request = self._request(messages, stop, kwargs)
        skipped = facts_for(engine, request)
        for piece in shown_stream(engine.stream_chat(**request)):
            chunk = self._chunk(engine, piece, request["user_id"], skipped)
            if run_manager and piece.text:
                run_manager.on_llm_new_token(piece.text, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        engine, request = self._request(messages, stop, kwargs)
        skipped = await afacts_for(engine, request)
        async for piece in ashown_stream(engine.astream_chat(**request)):
            chunk = self._chunk(engine, piece, request["user_id"], skipped)
            if run_manager and piece.text:
                await run_manager.on_llm_new_token(piece.text, chunk=chunk)
            yield chunk

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable | BaseTool], *,
                   tool_choice: str | bool | dict[str, Any] | None = None,
                   parallel_tool_calls: bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Let the model call ``tools`` (OpenAI tool dicts, pydantic models, functions or
        LangChain tools); the calls come back in ``AIMessage.tool_calls``.

        Args:
            tool_choice: ``"auto"`` (default), ``"none"``, ``"required"`` (or ``"any"``), a
                tool's name, or ``True`` (the one tool given).
            parallel_tool_calls: ``False``: at most one call per answer.

        Raises:
            ValueError: A ``tool_choice`` that names no given tool.
        """
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = _tool_choice(tool_choice, formatted)
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(  # type: ignore[override]
            self, schema: dict[str, Any] | type, *, include_raw: bool = False,
            method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
            strict: bool | None = None,
            **kwargs: Any) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Answers parsed into ``schema`` (a pydantic model, a TypedDict, a JSON schema or
        an OpenAI tool dict), decoded under the schema's grammar.

        Args:
            method: ``"function_calling"``: a forced call of a tool named after the schema;
                ``"json_schema"``: the answer itself under the schema (``response_format``);
                ``"json_mode"``: any JSON object (say which in the prompt).
            include_raw: Return ``{"raw", "parsed", "parsing_error"}`` instead.

        Raises:
            ValueError: An unknown ``method`` or keyword.
        """
        if kwargs:
            raise ValueError(f"with_structured_output got unsupported arguments {sorted(kwargs)}")
        pydantic = is_basemodel_subclass(schema)  # pydantic 2, or pydantic.v1
        parser: Runnable[Any, Any]
        # What LangChain's callbacks (and LangSmith) report as the call's schema.
        traced = {"ls_structured_output_format": {
            "kwargs": {"method": method, "strict": strict}, "schema": schema}}
        if method == "function_calling":
            tool = convert_to_openai_tool(schema, strict=strict)
            name = tool["function"]["name"]
            llm = self.bind_tools([tool], tool_choice=name, parallel_tool_calls=False, **traced)
            parser = (PydanticToolsParser(tools=[schema], first_tool_only=True) if pydantic
                      else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
        elif method == "json_schema":
            json_schema = convert_to_json_schema(schema, strict=strict)
            body = {"name": json_schema.get("title", "output"), "schema": json_schema}
            if strict is not None:
                body["strict"] = strict
            llm = self.bind(response_format={"type": "json_schema", "json_schema": body},
                            **traced)
            parser = (PydanticOutputParser(pydantic_object=schema) if pydantic  # type: ignore[arg-type]
                      else JsonOutputParser())
        elif method == "json_mode":
            llm = self.bind(response_format={"type": "json_object"}, **traced)
            parser = (PydanticOutputParser(pydantic_object=schema) if pydantic  # type: ignore[arg-type]
                      else JsonOutputParser())
        else:
            raise ValueError(f"method must be 'function_calling', 'json_schema' or "
                             f"'json_mode'; got {method!r}")
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser,
                                            parsing_error=lambda _: None)
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback],
                                                             exception_key="parsing_error")

    # -- helpers --------------------------------------------------------------------------

    def _engine(self) -> MemoryEngine:
        return self.engine if self.engine is not None else default_engine(self.model_name)

    def _request(self, messages: list[BaseMessage], stop: list[str] | None,
                 kwargs: dict[str, Any]) -> tuple[MemoryEngine, dict[str, Any]]:
        unknown = set(kwargs) - {*MEMORY_KEYS, *SAMPLING, *TOOL_KEYS, "model", "stream"}
        if unknown:
            raise ValueError(f"ChatInferScale got unknown call options {sorted(unknown)}; "
                             f"it takes {sorted({*MEMORY_KEYS, *SAMPLING, *TOOL_KEYS})}")
        options = {key: kwargs.get(key, getattr(self, key)) for key in SAMPLING}
        options["stop"] = stop if stop is not None else self.stop
        request = {"messages": _to_openai(messages),
                   "user_id": kwargs.get("user_id", self.user_id),
                   "k": kwargs.get("k", self.k), "mode": kwargs.get("mode", self.mode),
                   **{key: value for key, value in options.items() if value not in (None, [])},
                   **{key: kwargs[key] for key in TOOL_KEYS if kwargs.get(key) is not None}}
        if self.timeout is not None:
            request["timeout"] = self.timeout
        return self._engine(), request

    def _chat_result(self, engine: MemoryEngine, result: MemoryResult, user_id: str | None,
                     skipped: list[str]) -> ChatResult:
        calls, invalid = [], []
        for call in result.tool_calls:
            args = call_arguments(call.arguments)
            if args is None:  # no JSON object: kept as it came, as LangChain does
                invalid.append(invalid_tool_call(name=call.name, args=call.arguments,
                                                 id=call.id, error="arguments are no JSON object"))
            else:
                calls.append(tool_call(name=call.name, args=args, id=call.id))
        message = AIMessage(content=result.text, tool_calls=calls, invalid_tool_calls=invalid,
                            usage_metadata=_usage(result),
                            response_metadata=self._metadata(engine, result, user_id, skipped))
        return ChatResult(generations=[ChatGeneration(message=message)],
                          llm_output={"model_name": self._model_label})

    def _chunk(self, engine: MemoryEngine, piece: ChatChunk, user_id: str | None,
               skipped: list[str]) -> ChatGenerationChunk:
        calls = [tool_call_chunk(name=delta.name, args=delta.arguments, id=delta.id,
                                 index=delta.index) for delta in piece.tool_calls]
        if piece.result is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=piece.text,
                                                              tool_call_chunks=calls))
        message = AIMessageChunk(content=piece.text, tool_call_chunks=calls,
                                 usage_metadata=_usage(piece.result),
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


def _to_openai(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        role = ROLES.get(message.type) or str(getattr(message, "role", ""))
        if role not in ROLES.values():
            raise ValueError(f"ChatInferScale cannot take {message.type!r} messages: "
                             "only system, human, ai and tool messages")
        # An AI message's "tool_use" blocks (Anthropic's form) repeat its tool_calls.
        calls = ("tool_call", "tool_use") if isinstance(message, AIMessage) \
            and message.tool_calls else ("tool_call",)
        if isinstance(message.content, list) and any(
                not isinstance(block, str) and block.get("type") not in ("text", *calls)
                for block in message.content):
            raise ValueError("ChatInferScale takes text content only")
        entry: dict[str, Any] = {"role": role, "content": message.text}
        if isinstance(message, AIMessage) and message.tool_calls:
            entry["tool_calls"] = [
                {"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": json.dumps(call["args"])}}
                for call in message.tool_calls]
        if isinstance(message, ToolMessage):
            entry["tool_call_id"] = message.tool_call_id
        out.append(entry)
    return out


def _tool_choice(choice: str | bool | dict[str, Any],
                 tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """LangChain's ``tool_choice`` in OpenAI's shape."""
    names = [tool["function"]["name"] for tool in tools]
    if choice is True:
        if len(names) != 1:
            raise ValueError(f"tool_choice=True needs exactly one tool; got {len(names)}")
        choice = names[0]
    if choice is False:
        return "none"
    if isinstance(choice, dict):
        return choice
    if choice == "any":
        return "required"
    if choice in TOOL_CHOICES:
        return choice
    if choice not in names:
        raise ValueError(f"tool_choice {choice!r} names no bound tool; the tools are {names}")
    return {"type": "function", "function": {"name": choice}}


def _usage(result: MemoryResult) -> UsageMetadata:
    metrics = result.metrics
    return UsageMetadata(
        input_tokens=metrics.prompt_tokens, output_tokens=metrics.output_tokens,
        total_tokens=metrics.prompt_tokens + metrics.output_tokens,
        input_token_details={"cache_read": metrics.injected_tokens + metrics.cached_tokens})


"""Request and response models of the OpenAI-compatible endpoints (chat, models, errors).

Requests honour OpenAI's sampling parameters (``temperature``, ``top_p``,
``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``, ``max_tokens``; vLLM's
``top_k`` and ``ignore_eos``), accept and ignore bookkeeping ones (``metadata``, ``store``,
...) and reject ones whose silent omission would change the answer (``functions``,
``logit_bias``, ``n`` > 1). ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
``response_format`` (``json_object``, ``json_schema``) are OpenAI's (see
:mod:`inferscale_memory.tools`). Validation is strict:
no string or boolean is coerced to another type (``"stream": "yes"`` and ``"k": true`` are
400s). The memory extensions are ``memory`` in the request (:class:`MemoryOptions`) and
``memory`` in the response (:class:`MemoryReport`), plus ``injected_tokens`` and
``computed_prompt_tokens`` in ``usage``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferscale_memory.fields import (
    FactCount,
    FactOrder,
    MaxTokens,
    Mode,
    Penalty,
    RecomputeTail,
    Seed,
    Stop,
    Temperature,
    TopK,
    TopP,
)

# The server's own limits, over the engine's rules (the field types).
MAX_K = 1024
MAX_MESSAGES = 1024
MAX_ANSWER_TOKENS = 1_000_000


class ErrorDetail(BaseModel):
    """The ``error`` object of an error response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error response: ``{"error": {...}}``."""

    error: ErrorDetail


class TextPart(BaseModel):
    """A text content part (the only kind supported)."""

    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class FunctionCallParam(BaseModel):
    """The function of a tool call: ``arguments`` is a JSON object as text."""

    model_config = ConfigDict(extra="ignore", strict=True)

    name: str
    arguments: str


class ToolCallParam(BaseModel):
    """A tool call of an earlier assistant message."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessage(BaseModel):
    """One message of the conversation (``developer`` is treated as ``system``).

    An ``assistant`` message may carry ``tool_calls`` (``content`` may then be null), and a
    ``tool`` message carries the result of one (``tool_call_id``).
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = Field(None, max_length=128)
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text (text parts joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content or [])

    def to_engine(self) -> dict[str, Any]:
        """The message as :meth:`MemoryEngine.chat` takes it."""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": None if self.content is None else self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionParam(BaseModel):
    """A function the model may call: its ``parameters`` are a JSON schema."""

    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function"]
    function: FunctionParam


class NamedFunction(BaseModel):
    model_config = ConfigDict(strict=True)

    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming the function the model must call."""

    model_config = ConfigDict(strict=True)

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the answer is JSON valid against ``schema``."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = Field(max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``text``, ``json_object`` or ``json_schema`` (guided decoding)."""

    model_config = ConfigDict(strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def to_engine(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        if self.json_schema is None:
            return {"type": "json_schema"}  # the engine says what is missing
        spec = self.json_schema.model_dump(by_alias=True, exclude_none=True)
        return {"type": "json_schema", "json_schema": spec}


class MemoryOptions(BaseModel):
    """How the answer uses the user's memory.

    Attributes:
        k: Facts retrieved (default: the engine's ``k``).
        mode: ``kv`` injects the facts' KV, ``text`` prefills them as text (same token
            ids), ``off`` answers without memory.
        fact_order: ``rank`` (best-ranked fact last) or ``time`` (oldest first); default:
            the engine's ``fact_order``.
        recompute_tail: The last this many facts are computed by the engine instead of
            injected (they attend to the facts before them); default: the engine's.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    k: Annotated[FactCount, Field(le=MAX_K)] | None = None
    mode: Mode | Literal["off"] = "kv"
    fact_order: FactOrder | None = None
    recompute_tail: Annotated[RecomputeTail, Field(le=MAX_K)] | None = None


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(max_length=512)
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: Annotated[MaxTokens, Field(le=MAX_ANSWER_TOKENS)] | None = None
    max_completion_tokens: Annotated[MaxTokens, Field(le=MAX_ANSWER_TOKENS)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = Field(None, description="vLLM's extension (0: every token)")
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    ignore_eos: bool = Field(False, description="vLLM's extension: generate max_tokens "
                             "tokens, past the end-of-sequence token")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="Only 1 is supported")
    user: str | None = Field(None, description="The memory user (or X-Memory-User)")
    memory: MemoryOptions | None = None
    tools: list[ToolParam] | None = Field(None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = Field(None, description="Not supported: must be absent "
                                        "(use tools)")
    logit_bias: dict[str, Any] | None = Field(None, description="Not supported: must be absent")
    response_format: ResponseFormat | None = None

    def stop_list(self) -> list[str] | None:
        """``stop`` as a list (``None`` when absent)."""
        if self.stop is None:
            return None
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class MemoryReport(BaseModel):
    """The memory part of an answer: which facts were used and how."""

    user: str | None
    mode: Literal["kv", "text", "off"]
    k: int | None
    memory_used: bool = Field(description=(
        "Whether any fact was in the prompt; false: answered without memory (memory off, "
        "no user, or a user with no facts yet)"))
    fact_ids: list[str] = Field(description="Facts in the prompt, best-ranked last")
    recomputed_fact_ids: list[str] = Field(
        description="Facts whose KV was missing and were recomputed from text")
    ttft_ms: float
    retrieval_ms: float


class PromptTokensDetails(BaseModel):
    """``usage.prompt_tokens_details``."""

    cached_tokens: int = Field(description="Prompt tokens from vLLM's prefix cache")


class Usage(BaseModel):
    """Token counts of an answer, with the memory extensions."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    injected_tokens: int = Field(description="Prompt tokens whose KV was injected")
    computed_prompt_tokens: int = Field(description="Prompt tokens the engine computed")
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="The arguments, a JSON object as text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    """A non-streamed answer."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    memory: MemoryReport


class ChunkFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(BaseModel):
    """A piece of tool call ``index``: ``id`` and ``name`` come first, then arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChunkFunctionCall


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed answer (``memory`` on the finishing chunk)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    memory: MemoryReport | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inferscale-memory"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    model: str

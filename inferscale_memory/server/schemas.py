"""Request and response models of the OpenAI-compatible endpoints (chat, models, errors).

Requests honour OpenAI's sampling parameters (``temperature``, ``top_p``,
``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``, ``max_tokens``; vLLM's
``top_k`` and ``ignore_eos``), accept and ignore bookkeeping ones (``metadata``, ``store``,
...) and reject ones whose silent omission would change the answer (``functions``,
``logit_bias``, ``n`` > 1). ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
``response_format`` (``json_object``, ``json_schema``) are OpenAI's (see
:mod:`inferscale_memory.tools`). Validation is strict: no string or boolean is coerced to
another type (``"stream": "yes"`` and ``"k": true`` are 400s). The messages and the fields
the engine takes are checked by the engine alone (:data:`ENGINE_FIELDS`): this schema shows
them with the engine's own types (:mod:`inferscale_memory.fields`,
:mod:`inferscale_memory.tools.shapes`, :class:`~inferscale_memory.conversation.ChatMessage`)
for the OpenAPI document and passes them on as sent. The memory extensions are ``memory``
in the request (:class:`MemoryOptions`: its fields the engine takes, :data:`MEMORY_FIELDS`,
are shown and passed on alike) and ``memory`` in the response (:class:`MemoryReport`),
plus ``injected_tokens`` and ``computed_prompt_tokens`` in ``usage``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation

from inferscale_memory.conversation import ChatMessage
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
from inferscale_memory.tools.shapes import ResponseFormat, ToolChoice, ToolParam

# The server's own limits, over the engine's rules (the field types).
MAX_K = 1024  # of memory.k and memory.recompute_tail: checked by the chat handler
MAX_MESSAGES = 1024  # checked by the chat handler: the engine checks the messages
MAX_TOP_LOGPROBS = 20  # OpenAI's bound of top_logprobs (the engine's max_logprobs bounds it too)
# The request's fields that the engine checks, passed to it as sent; ``messages`` too.
ENGINE_FIELDS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                 "presence_penalty", "frequency_penalty", "stop", "seed", "ignore_eos",
                 "tools", "tool_choice", "parallel_tool_calls", "response_format")
# The fields of ``memory`` that the engine checks, as its arguments of the same name; its
# refusal of one names it as the request does (``memory.k``).
MEMORY_FIELDS = ("k", "fact_order", "recompute_tail")


class ErrorDetail(BaseModel):
    """The ``error`` object of an error response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error response: ``{"error": {...}}``."""

    error: ErrorDetail


class MemoryOptions(BaseModel):
    """How the answer uses the user's memory.

    ``k``, ``fact_order`` and ``recompute_tail`` (:data:`MEMORY_FIELDS`) are shown with the
    engine's types and passed to it as sent, like the chat's other engine fields; the chat
    handler adds the server's bound (:data:`MAX_K`). ``mode`` is the server's own: its
    ``off`` is the engine's ``memory=False``.

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

    k: SkipValidation[Annotated[FactCount, Field(le=MAX_K)] | None] = None
    mode: Literal[Mode, "off"] = "kv"
    fact_order: SkipValidation[FactOrder | None] = None
    recompute_tail: SkipValidation[Annotated[RecomputeTail, Field(le=MAX_K)] | None] = None


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``.

    The fields the engine takes (:data:`ENGINE_FIELDS`) are shown with the engine's types
    and passed to it as sent: the engine checks them (:func:`check_chat`), so this schema
    does not check them again, and a refusal names the same ``param`` as ``engine.chat``'s.
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(max_length=512)
    messages: SkipValidation[Annotated[list[ChatMessage],
                                       Field(min_length=1, max_length=MAX_MESSAGES)]]
    max_tokens: SkipValidation[MaxTokens | None] = None
    max_completion_tokens: SkipValidation[MaxTokens | None] = None
    temperature: SkipValidation[Temperature | None] = None
    top_p: SkipValidation[TopP | None] = None
    top_k: SkipValidation[TopK | None] = Field(None, description="vLLM's extension "
                                               "(0: every token)")
    presence_penalty: SkipValidation[Penalty | None] = None
    frequency_penalty: SkipValidation[Penalty | None] = None
    stop: SkipValidation[Stop | None] = None
    seed: SkipValidation[Seed | None] = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    ignore_eos: SkipValidation[bool] = Field(False, description="vLLM's extension: generate "
                                             "max_tokens tokens, past the end-of-sequence token")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="Only 1 is supported")
    user: str | None = Field(None, description="The memory user (or X-Memory-User)")
    memory: MemoryOptions | None = None
    tools: SkipValidation[list[ToolParam] | None] = Field(
        None, description="At most the engine's schema_limits.tools (128 by default)")
    tool_choice: SkipValidation[ToolChoice | None] = None
    parallel_tool_calls: SkipValidation[bool | None] = None
    functions: list[Any] | None = Field(None, description="Not supported: must be absent "
                                        "(use tools)")
    logit_bias: dict[str, Any] | None = Field(None, description="Not supported: must be absent")
    response_format: SkipValidation[ResponseFormat | None] = None

    def engine_options(self) -> dict[str, Any]:
        """The engine's fields (:data:`ENGINE_FIELDS`) the request gave, as it gave them."""
        return {name: getattr(self, name) for name in ENGINE_FIELDS
                if name in self.model_fields_set and getattr(self, name) is not None}


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

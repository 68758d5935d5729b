"""Request and response models of the OpenAI-compatible endpoints (chat, models, errors).

Requests honour OpenAI's sampling parameters (``temperature``, ``top_p``,
``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``, ``max_tokens``; vLLM's
``top_k`` and ``ignore_eos``), accept and ignore bookkeeping ones (``metadata``, ``store``,
...) and reject ones whose silent omission would change the answer (``tools``,
``logit_bias``, a ``response_format`` other than text, ``n`` > 1). Validation is strict:
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


class ChatMessage(BaseModel):
    """One message of the conversation (``developer`` is treated as ``system``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        """The message's text (text parts joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class MemoryOptions(BaseModel):
    """How the answer uses the tenant's memory.

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
    user: str | None = Field(None, description="The memory tenant (or X-Memory-User)")
    memory: MemoryOptions | None = None
    tools: list[Any] | None = Field(None, description="Not supported: must be absent")
    functions: list[Any] | None = Field(None, description="Not supported: must be absent")
    logit_bias: dict[str, Any] | None = Field(None, description="Not supported: must be absent")
    response_format: dict[str, Any] | None = Field(
        None, description='Only {"type": "text"} is supported')

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


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


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


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


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

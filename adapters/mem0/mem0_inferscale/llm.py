"""Mem0's LLM on the engine: a Mem0 LLM provider (``"inferscale"``) for extraction.

Mem0 calls :meth:`InferScaleLLM.generate_response` as it calls any provider's: in 2.2.1,
``add(..., infer=True)`` makes one call with its extraction prompt and
``response_format={"type": "json_object"}``. The call runs on the engine without memory
(``engine.chat(..., memory=False)``, its prefix cache shared under the config's
``cache_user``), ``response_format`` goes to the engine's guided
decoding, and Mem0's extraction call gets two things more (:mod:`.extraction`): the JSON
schema of the answer Mem0 parses instead of any JSON object, and, when Mem0's prompt does
not fit the model's context, a compact system prompt of ours. So even SmolLM2-135M (8,192
tokens; Mem0's prompt alone is about 8,600) extracts facts Mem0 can read; where its
memories are plainly wrong, :class:`~mem0_inferscale.extraction.ExtractionError` says so
and Mem0 stores none.

Mem0 checks provider names against a fixed list when it validates a config dict, so
:func:`llm_config` builds the ``llm`` section as Mem0's own ``LlmConfig`` object
(unvalidated, like a dict Mem0 already checked), and :func:`register` adds the provider to
Mem0's ``LlmFactory`` (its public ``register_provider``).
"""

from __future__ import annotations

import json
from typing import Any

from mem0.configs.llms.base import BaseLlmConfig
from mem0.llms.base import LLMBase
from mem0.llms.configs import LlmConfig
from mem0.utils.factory import LlmFactory

from inferscale_memory import MemoryEngine
from mem0_inferscale.extraction import (
    EXTRACTION_FORMAT,
    ExtractionError,
    extraction_problems,
    fit_extraction,
    is_extraction,
)

PROVIDER = "inferscale"


class InferScaleLlmConfig(BaseLlmConfig):
    """Mem0's LLM settings plus the engine to run on (``model`` is the engine's model).

    ``cache_user``: the name under which this LLM's calls share vLLM's prefix cache. The
    engine keeps calls that name no user apart (a caller must ask to share cached blocks),
    and Mem0's extraction prompt is long and the same on every call: under one name it is
    computed once. Give each tenant a config of its own when their extraction inputs must
    not share cached blocks either.
    """

    def __init__(self, engine: MemoryEngine | None = None, cache_user: str = "mem0-llm",
                 **kwargs: Any) -> None:
        if not isinstance(engine, MemoryEngine):
            raise TypeError(f"the {PROVIDER!r} LLM needs engine=<a MemoryEngine>; got "
                            f"{type(engine).__name__}: use mem0_inferscale.mem0_config(engine)")
        kwargs.setdefault("model", engine.model_name)
        super().__init__(**kwargs)
        self.engine = engine
        self.cache_user = cache_user


class InferScaleLLM(LLMBase):
    """A Mem0 LLM that answers on a :class:`~inferscale_memory.MemoryEngine`.

    Example:
        >>> llm = InferScaleLLM(InferScaleLlmConfig(engine=engine))  # doctest: +SKIP
        >>> llm.generate_response([{"role": "user", "content": "Hi"}],
        ...                       response_format={"type": "json_object"})
        '{}'
    """

    config: InferScaleLlmConfig

    def __init__(self, config: InferScaleLlmConfig) -> None:
        if not isinstance(config, InferScaleLlmConfig):
            raise TypeError("InferScaleLLM needs an InferScaleLlmConfig(engine=...)")
        super().__init__(config)
        self.engine = config.engine

    def generate_response(self, messages: list[dict[str, Any]],
                          response_format: dict[str, Any] | None = None,
                          tools: list[dict[str, Any]] | None = None,
                          tool_choice: str | dict[str, Any] = "auto",
                          **kwargs: Any) -> str | dict[str, Any]:
        """Answer ``messages`` on the engine, without memory.

        Mem0's extraction call (its system prompt, ``response_format`` ``json_object`` or
        none) is guided by the schema of the answer Mem0 parses, and gets the compact
        prompt when Mem0's does not fit the context (:func:`.extraction.fit_extraction`).
        Any other ``response_format`` goes to the engine as given.

        Returns:
            The text; with ``tools``, Mem0's ``{"content", "tool_calls": [{"name",
            "arguments": dict}]}``.

        Raises:
            inferscale_memory.InvalidInputError: Bad messages, tools or response_format.
            inferscale_memory.ContextLengthError: The prompt does not fit, even compact.
            ExtractionError: The extracted memories are plainly wrong (cut, repeated,
                empty, one word): the model cannot extract these messages (Mem0 raises its
                ``LLMError`` from it and stores none).
        """
        extracting = is_extraction(messages) and response_format in (
            None, {"type": "json_object"})
        if extracting:
            messages = fit_extraction(messages, self.count_tokens,
                                      self.engine.max_model_len - self.config.max_tokens)
            response_format = EXTRACTION_FORMAT
        options = dict(kwargs, max_tokens=self.config.max_tokens,
                       temperature=self.config.temperature, top_p=self.config.top_p)
        if response_format is not None:
            options["response_format"] = response_format
        if tools:
            options.update(tools=tools, tool_choice=tool_choice)
        result = self.engine.chat(messages, user_id=self.config.cache_user, memory=False,
                                  **options)
        if extracting and (problems := extraction_problems(
                result.text, finished=result.finish_reason != "length")):
            raise ExtractionError(self.engine.model_name, problems)
        if not tools:
            return result.text
        return {"content": result.text,
                "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)}
                               for c in result.tool_calls]}

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The length of ``messages`` in the engine's tokens, as the engine sends them."""
        return self.engine.count_prompt_tokens(messages)


def llm_config(engine: MemoryEngine, **settings: Any) -> LlmConfig:
    """Mem0's ``llm`` config section for :class:`InferScaleLLM` on ``engine``.

    ``settings`` are Mem0's LLM settings (``max_tokens``, ``temperature``, ``top_p``).
    Built without Mem0's validation, whose provider list does not know ``"inferscale"``.
    """
    register()
    InferScaleLlmConfig(engine=engine, **settings)  # bad settings fail here, not in Mem0
    return LlmConfig.model_construct(provider=PROVIDER, config={"engine": engine, **settings})


def register() -> None:
    """Make ``"inferscale"`` a provider of Mem0's ``LlmFactory`` (idempotent)."""
    LlmFactory.register_provider(PROVIDER, f"{__name__}.InferScaleLLM", InferScaleLlmConfig)

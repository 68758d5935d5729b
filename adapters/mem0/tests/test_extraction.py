"""Which extraction prompt Mem0's add() gets: Mem0's own where it fits, ours where not.

The embedded model's tokenizer only (no engine): Mem0's real messages, built by Mem0.
"""

from __future__ import annotations

import json

import pytest
from mem0.configs.prompts import (
    ADDITIVE_EXTRACTION_PROMPT,
    AGENT_CONTEXT_SUFFIX,
    generate_additive_extraction_prompt,
)
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from inferscale_memory import MemoryConfig
from inferscale_memory.layout import PromptBuilder
from inferscale_memory.models import resolve_model
from mem0_inferscale import InferScaleLLM, InferScaleLlmConfig
from mem0_inferscale.extraction import (
    COMPACT_EXTRACTION_PROMPT,
    MAX_TEXT_CHARS,
    ExtractionError,
    extraction_problems,
    fit_extraction,
    is_extraction,
)
from mem0_inferscale.llm import llm_config

CONTEXT = 8192  # SmolLM2-135M-Instruct's
ANSWER = 512


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(resolve_model(None, MemoryConfig().cache_dir)))


def prompt_tokens(builder: PromptBuilder, messages: list[dict[str, str]]) -> int:
    """As MemoryEngine.count_prompt_tokens counts (the engine's builder, no memory)."""
    return len(builder.build(messages, []).token_ids)


def mem0_messages(system: str = ADDITIVE_EXTRACTION_PROMPT) -> list[dict[str, str]]:
    user = generate_additive_extraction_prompt(
        existing_memories=[{"id": "0", "text": "User has a cat."}],
        new_messages="user: I moved to Lisbon in May.", last_k_messages=[],
        custom_instructions="Keep the dates.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_mem0s_prompt_is_replaced_only_where_it_does_not_fit(
        tokenizer: PreTrainedTokenizerBase) -> None:
    messages = mem0_messages()
    count = lambda m: prompt_tokens(PromptBuilder(tokenizer), m)  # noqa: E731
    assert count(messages) + ANSWER > CONTEXT  # Mem0 2.2.1's prompt: too long for SmolLM2

    fitted = fit_extraction(messages, count, CONTEXT - ANSWER)
    assert fitted[0] == {"role": "system", "content": COMPACT_EXTRACTION_PROMPT}
    assert fitted[1] == messages[1]  # Mem0's user prompt: conversation, memories, instructions
    assert count(fitted) + ANSWER < CONTEXT // 4
    assert messages[0]["content"] == ADDITIVE_EXTRACTION_PROMPT  # the caller's, untouched

    roomy = 4 * CONTEXT  # a model with a long context keeps Mem0's own prompt
    assert fit_extraction(messages, count, roomy) == messages


def test_an_agents_extraction_keeps_mem0s_agent_suffix(
        tokenizer: PreTrainedTokenizerBase) -> None:
    messages = mem0_messages(ADDITIVE_EXTRACTION_PROMPT + AGENT_CONTEXT_SUFFIX)
    fitted = fit_extraction(messages, lambda m: prompt_tokens(PromptBuilder(tokenizer), m),
                            CONTEXT)
    assert fitted[0]["content"] == COMPACT_EXTRACTION_PROMPT + AGENT_CONTEXT_SUFFIX


def test_only_mem0s_extraction_call_is_recognised() -> None:
    assert is_extraction(mem0_messages())
    assert is_extraction(mem0_messages(ADDITIVE_EXTRACTION_PROMPT + AGENT_CONTEXT_SUFFIX))
    assert not is_extraction([{"role": "user", "content": ADDITIVE_EXTRACTION_PROMPT}])
    assert not is_extraction([{"role": "system", "content": "Answer in one word."}])
    assert not is_extraction([])


def test_the_llm_needs_an_engine() -> None:
    with pytest.raises(TypeError, match="mem0_config"):
        InferScaleLlmConfig()
    with pytest.raises(TypeError, match="MemoryEngine"):
        llm_config("not an engine")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="InferScaleLlmConfig"):
        InferScaleLLM({"engine": None})  # type: ignore[arg-type]


def answer(*texts: str) -> str:
    return json.dumps({"memory": [{"id": str(i), "text": text, "attributed_to": "user"}
                                  for i, text in enumerate(texts)]})


OMAR = "Hi, I'm Omar. I grow tomatoes on my balcony and I work as a baker in Madrid."
# What SmolLM2-135M wrote for OMAR (issue 31): the message, then one sentence until cut.
OMARS_MEMORY = (OMAR + " I'm a baker in Madrid." * 10)[:MAX_TEXT_CHARS]


def test_distinct_complete_facts_are_no_problem() -> None:
    assert extraction_problems(answer("Omar grows tomatoes on his balcony.",
                                      "Omar works as a baker in Madrid.")) == []
    assert extraction_problems(answer()) == []  # nothing worth remembering


def test_a_memory_cut_and_repeating_itself_is_a_problem() -> None:
    problems = extraction_problems(answer(OMARS_MEMORY))
    assert any(p.startswith(f"a memory cut at {MAX_TEXT_CHARS} characters") for p in problems)
    assert any(p.startswith('"I\'m a baker in Madrid." repeated') for p in problems)


def test_repeated_empty_and_unfinished_answers_are_problems() -> None:
    assert extraction_problems(answer("Omar bakes.", "Omar  bakes.")) == [
        '"Omar bakes." written 2 times']
    assert extraction_problems(answer(" ")) == ["an empty memory"]
    assert extraction_problems(answer("user")) == ['"user", one word, is no fact']
    cut = answer("Omar bakes.")[:-3]
    assert extraction_problems(cut, finished=False)[0].startswith("the answer reached max_tokens")


def test_the_error_says_what_to_do() -> None:
    error = ExtractionError("SmolLM2-135M-Instruct", extraction_problems(answer(OMARS_MEMORY)))
    assert "SmolLM2-135M-Instruct could not extract" in str(error)
    assert "infer=False" in str(error) and "instruct model" in str(error)

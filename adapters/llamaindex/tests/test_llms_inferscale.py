"""InferScaleLLM on the real engine: chat, complete, streaming and async, with memory."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse

from inferscale_memory import MemoryEngine
from llama_index_inferscale import InferScaleLLM

pytestmark = pytest.mark.engine
QUESTION = "Where does Caroline live?"


def ask(question: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=question)]


def memory_of(response: ChatResponse) -> dict:
    return response.additional_kwargs["memory"]


def test_kv_answer_matches_the_text_path(engine: MemoryEngine,
                                         block_fact: Callable[[str], str]) -> None:
    fact = engine.memory.add(block_fact("Caroline moved to Berlin in May 2023."),
                             user_id="li-exact")
    llm = InferScaleLLM(engine=engine, user_id="li-exact", k=1, max_tokens=16)
    engine.reset_prefix_cache()
    llm.chat(ask(QUESTION), mode="text")  # warms vLLM's prefix cache with header + fact
    text = llm.chat(ask(QUESTION), mode="text")
    kv = llm.chat(ask(QUESTION))
    assert memory_of(kv)["fact_ids"] == [fact.id]
    assert memory_of(kv)["injected_tokens"] == engine.runtime.block_size
    assert memory_of(text)["injected_tokens"] == 0
    assert kv.message.content == text.message.content


def test_complete_and_stream_carry_the_memory_metrics(engine: MemoryEngine) -> None:
    engine.memory.add("Ann plays the cello.", user_id="li-sync")
    llm = InferScaleLLM(engine=engine, user_id="li-sync", max_tokens=8)
    completion = llm.complete("What does Ann play?")
    assert completion.text and completion.additional_kwargs["memory"]["injected_tokens"] > 0
    responses = list(llm.stream_chat(ask("What does Ann play?")))
    assert responses[-1].message.content == "".join(r.delta for r in responses)
    assert memory_of(responses[-1])["injected_tokens"] > 0
    assert responses[-1].message.content == completion.text


async def test_async_variants(engine: MemoryEngine) -> None:
    engine.memory.add("Eve's favourite colour is green.", user_id="li-async")
    llm = InferScaleLLM(engine=engine, user_id="li-async", max_tokens=8)
    response = await llm.achat(ask("What is Eve's favourite colour?"))
    assert memory_of(response)["injected_tokens"] > 0
    stream = await llm.astream_chat(ask("What is Eve's favourite colour?"))
    pieces = [piece async for piece in stream]
    assert pieces[-1].message.content == response.message.content
    completion = await llm.acomplete("What is Eve's favourite colour?")
    assert completion.text == response.message.content
    deltas = [c.delta async for c in await llm.astream_complete("What is Eve's colour?")]
    assert deltas


async def test_without_user_or_facts_there_is_no_memory(engine: MemoryEngine) -> None:
    for user in (None, "li-new-user"):
        llm = InferScaleLLM(engine=engine, user_id=user, max_tokens=4)
        streamed = list(llm.stream_chat(ask("Hi")))
        astreamed = [r async for r in await llm.astream_chat(ask("Hi"))]
        for response in (llm.chat(ask("Hi")), await llm.achat(ask("Hi")), streamed[-1],
                         astreamed[-1]):
            assert response.message.content
            assert memory_of(response)["memory_used"] is False
            assert memory_of(response)["injected_tokens"] == 0
            assert memory_of(response)["fact_ids"] == []


def test_another_users_identical_prompt_is_not_served_from_the_cache(
        engine: MemoryEngine) -> None:
    words = "Li's PIN is 4417, on a card in the blue drawer of the oak desk. " * (
        2 * engine.runtime.block_size // 20 + 1)

    def cached(user: str) -> int:
        llm = InferScaleLLM(engine=engine, user_id=user, max_tokens=1)
        return int(memory_of(llm.chat(ask(f"{words} What is the PIN?")))["cached_tokens"])

    engine.reset_prefix_cache()
    cached("li-salt-a")
    assert cached("li-salt-a") > 0  # the user's own repeat
    assert cached("li-salt-b") == 0  # another user's guess of it


def test_sampling_parameters_reach_vllm(engine: MemoryEngine) -> None:
    question = ask("Name three colours.")
    greedy = InferScaleLLM(engine=engine, max_tokens=16).chat(question).message.content
    sampled = InferScaleLLM(engine=engine, max_tokens=16, temperature=1.0, seed=7)
    assert sampled.chat(question).message.content != greedy  # sampling at temperature 1
    assert InferScaleLLM(engine=engine, max_tokens=16, temperature=1.0, seed=7,
                         top_k=1).chat(question).message.content == greedy
    assert sampled.chat(question, top_p=1e-9).message.content == greedy


def test_unknown_parameters_are_refused_at_construction_and_call(engine: MemoryEngine) -> None:
    import pydantic

    with pytest.raises(pydantic.ValidationError):
        InferScaleLLM(engine=engine, top_q=0.9)
    with pytest.raises(ValueError, match="unknown call options"):
        InferScaleLLM(engine=engine).chat(ask("Hi"), top_q=0.9)


def test_context_window_is_the_engines(engine: MemoryEngine) -> None:
    assert InferScaleLLM(engine=engine).metadata.context_window == engine.max_model_len
    assert engine.max_model_len == engine.runtime.max_model_len == 4096  # the session's
    longer = SimpleNamespace(max_model_len=8192,                    # stands in for
                             model_name="SmolLM2-135M-Instruct",     # an 8k engine
                             tool_parser=None)                       # without tools
    assert InferScaleLLM(engine=longer).metadata.context_window == 8192
    assert InferScaleLLM(engine=engine, context_window=1000).metadata.context_window == 1000


async def test_a_timeout_covers_every_call_and_stream(engine: MemoryEngine) -> None:
    engine.memory.add("Otto rows on the lake at dawn.", user_id="li-timeout")
    llm = InferScaleLLM(engine=engine, user_id="li-timeout", max_tokens=64, timeout=0.001)
    question = ask("When does Otto row?")
    late = pytest.raises(TimeoutError, match=r"no answer within 0.001 s")
    with late:
        llm.chat(question)
    with late:
        await llm.achat(question)
    with late:  # no first chunk comes in time
        list(llm.stream_chat(question))
    with late:
        [piece async for piece in await llm.astream_chat(question)]
    with late:  # a per-call timeout overrides the field
        InferScaleLLM(engine=engine, user_id="li-timeout", max_tokens=64).complete(
            "When does Otto row?", timeout=0.001)

"""Real Mem0 (local mode: qdrant on disk, SQLite history) on the real engine."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mem0 import AsyncMemory, Memory
from mem0.exceptions import LLMError

import mem0_inferscale
from inferscale_memory import Fact, InvalidInputError, MemoryEngine
from mem0_inferscale import ExtractionError, InferScaleLLM, InferScaleVectorStore
from mem0_inferscale.extraction import extraction_problems

pytestmark = pytest.mark.engine
QUESTION = "Where does Caroline live?"
DEADLINE_S = 60  # an AsyncMemory call that hangs fails the test instead of the suite


@pytest.fixture
def memory(engine: MemoryEngine, tmp_path: Path) -> Iterator[Memory]:
    memory = mem0_inferscale.from_engine(engine, folder=str(tmp_path))
    yield memory
    memory.vector_store.client.close()  # the local qdrant (the wrapper passes it through)
    memory.close()


def kv_is_missing(engine: MemoryEngine, user_id: str, texts: dict[str, str]) -> list[str]:
    """Ids (of ``{id: text}``) whose KV the engine does not hold: an answer recomputes them.

    One answer per fact: the KV of the facts after a missing one in the prompt is
    recomputed too, so a shared answer would not tell which one was missing.
    """
    missing = []
    for fact_id, text in texts.items():
        fact = Fact(fact_id, user_id, text, {}, 0.0, 0.0)
        result = engine.answer([{"role": "user", "content": "ok"}], [fact], user_id=user_id,
                               max_tokens=1)
        if result.metrics.recomputed_fact_ids:
            missing.append(fact_id)
            engine.wait_for_background()  # the engine recaptures it: undo that
            engine.drop_kv(user_id, [fact_id])
    return missing


def test_answer_injects_what_mem0_stored(memory: Memory, engine: MemoryEngine,
                                         block_fact: Callable[[str], str]) -> None:
    assert isinstance(memory.vector_store, InferScaleVectorStore)
    added = memory.add(block_fact("Caroline moved to Berlin in May 2023."),
                       user_id="m0-exact", infer=False)
    memory_id = added["results"][0]["id"]
    options = dict(user_id="m0-exact", k=1, max_tokens=16)
    engine.reset_prefix_cache()
    mem0_inferscale.answer(memory, QUESTION, mode="text", **options)  # warm prefix cache
    text = mem0_inferscale.answer(memory, QUESTION, mode="text", **options)
    kv = mem0_inferscale.answer(memory, QUESTION, **options)
    assert kv.metrics.fact_ids == [memory_id]
    assert kv.metrics.injected_tokens == engine.runtime.block_size
    assert kv.metrics.recomputed_fact_ids == []  # captured when Mem0 stored it
    assert kv.token_ids == text.token_ids


def test_update_recaptures_and_delete_evicts(memory: Memory, engine: MemoryEngine) -> None:
    user = "m0-crud"
    first, second = (memory.add(text, user_id=user, infer=False)["results"][0]["id"]
                     for text in ("Liam lives in Oslo.", "Liam has a cat."))
    memory.update(first, text="Liam lives in Rome.")
    reply = mem0_inferscale.answer(memory, "Where does Liam live?", user_id=user, k=1,
                                   max_tokens=4)
    assert reply.metrics.fact_ids == [first] and reply.metrics.recomputed_fact_ids == []
    assert reply.facts[0].fact.text == "Liam lives in Rome."
    assert [e["event"] for e in memory.history(first)] == ["ADD", "UPDATE"]

    memory.delete(second)
    texts = {first: "Liam lives in Rome.", second: "Liam has a cat."}
    assert kv_is_missing(engine, user, texts) == [second]
    assert [m["id"] for m in memory.get_all(filters={"user_id": user})["results"]] == [first]
    memory.delete_all(user_id=user)
    assert memory.get_all(filters={"user_id": user})["results"] == []
    assert kv_is_missing(engine, user, {first: texts[first]}) == [first]
    assert [e["event"] for e in memory.history(second)] == ["ADD", "DELETE"]


def test_search_and_get_keep_mem0_behaviour(memory: Memory) -> None:
    added = memory.add([{"role": "user", "content": "Ann plays the cello."},
                        {"role": "user", "content": "Ann lives in Porto."}],
                       user_id="m0-read", metadata={"source": "chat"}, infer=False)
    ids = [r["id"] for r in added["results"]]
    found = memory.search("What instrument does Ann play?", top_k=1,
                          filters={"user_id": "m0-read"})["results"]
    assert found[0]["id"] == ids[0] and found[0]["memory"] == "Ann plays the cello."
    assert memory.get(ids[1])["metadata"]["source"] == "chat"
    assert memory.search("cello", filters={"user_id": "m0-nobody"})["results"] == []


def test_mem0_llm_runs_on_the_engine_with_response_format(memory: Memory) -> None:
    assert isinstance(memory.llm, InferScaleLLM)
    reply = memory.llm.generate_response(messages=[
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky?"}])
    assert isinstance(reply, str) and reply
    # The extraction's fit check counts the prompt the engine really sends (its preamble too).
    asked = [{"role": "system", "content": "Answer in one word."},
             {"role": "user", "content": "What colour is the sky?"}]
    sent = memory.llm.engine.chat(asked, memory=False, max_tokens=1)
    assert memory.llm.count_tokens(asked) == sent.metrics.prompt_tokens
    # response_format reaches the engine's guided decoding: JSON of the schema, even at 135M.
    schema = {"type": "object", "properties": {"colour": {"enum": ["blue", "grey"]}},
              "required": ["colour"], "additionalProperties": False}
    guided = memory.llm.generate_response(
        messages=[{"role": "user", "content": "What colour is the sky?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert json.loads(guided)["colour"] in ("blue", "grey")
    # Its calls share vLLM's prefix cache under one name (calls without a user share
    # nothing): Mem0's long, fixed extraction prompt is computed once.
    long_prompt = [{"role": "system", "content": "You extract facts. " * 120},
                   {"role": "user", "content": "Ann plays the cello."}]
    memory.llm.generate_response(messages=long_prompt)
    again = memory.llm.engine.chat(long_prompt, user_id=memory.llm.config.cache_user,
                                   memory=False, max_tokens=1)
    assert again.metrics.cached_tokens >= memory.llm.engine.runtime.block_size
    with pytest.raises(InvalidInputError, match="response_format"):
        memory.llm.generate_response(messages=[{"role": "user", "content": "Hi"}],
                                     response_format={"type": "yaml"})
    # Tools (the engine's own tool prompt on SmolLM2): a forced call comes back in Mem0's
    # shape, its arguments a dict of the tool's schema.
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Berlin", "Lisbon"]}},
        "required": ["city"], "additionalProperties": False}}}
    called = memory.llm.generate_response(
        messages=[{"role": "user", "content": "What is the weather in Lisbon?"}],
        tools=[weather], tool_choice="required")
    assert isinstance(called, dict) and called["tool_calls"], called
    assert called["tool_calls"][0]["name"] == "get_weather"
    assert called["tool_calls"][0]["arguments"]["city"] in ("Berlin", "Lisbon")
    with pytest.raises(InvalidInputError, match="tool"):
        memory.llm.generate_response(messages=[{"role": "user", "content": "Hi"}],
                                     tools=[weather], tool_choice="sometimes")


OMAR = "Hi, I'm Omar. I grow tomatoes on my balcony and I work as a baker in Madrid."
# A message SmolLM2-135M extracts (greedy): on longer ones ("Hi, I am Dana. I live in
# Lisbon and I work as a nurse.") it repeats one sentence until cut, an ExtractionError.
CHAT = [{"role": "user", "content": "I am Dana and I live in Lisbon."}]


def test_add_with_inference_extracts_captures_and_injects(memory: Memory,
                                                          engine: MemoryEngine) -> None:
    # Mem0's own flow (infer=True): its extraction prompt alone is longer than this
    # engine's context (4,096), so the compact prompt and guided JSON do the extraction.
    user = "m0-infer"
    added = memory.add(CHAT, user_id=user)["results"]
    assert added and all(r["event"] == "ADD" and r["memory"].strip() for r in added)
    stored = {m["id"]: m["memory"] for m in memory.get_all(filters={"user_id": user})["results"]}
    assert stored == {r["id"]: r["memory"] for r in added}
    assert kv_is_missing(engine, user, stored) == []  # captured when Mem0 stored them
    reply = mem0_inferscale.answer(memory, "Where does Dana live?", user_id=user,
                                   max_tokens=8)
    assert reply.metrics.injected_tokens > 0 and reply.metrics.recomputed_fact_ids == []
    assert set(reply.metrics.fact_ids) == set(stored)


def test_add_with_inference_stores_sane_memories_or_says_the_model_cannot(
        memory: Memory) -> None:
    # Issue 31's message, on which SmolLM2-135M wrote the message and then one sentence
    # over and over, cut at 200 characters.
    user = "m0-omar"
    try:
        added = memory.add(OMAR, user_id=user)["results"]
    except LLMError as error:
        assert isinstance(error.__cause__, ExtractionError), error
        assert "could not extract" in str(error) and "infer=False" in str(error)
        assert memory.get_all(filters={"user_id": user})["results"] == []
        return
    stored = [m["memory"] for m in memory.get_all(filters={"user_id": user})["results"]]
    assert stored and len(stored) == len(added)
    assert extraction_problems(json.dumps({"memory": [
        {"id": str(i), "text": text, "attributed_to": "user"}
        for i, text in enumerate(stored)]})) == [], stored


def test_extraction_that_cannot_fit_fails_with_the_engines_error(memory: Memory) -> None:
    long_chat = [{"role": "user", "content": "I like tea. " * 2000}]
    with pytest.raises(LLMError, match="exceeds the context"):
        memory.add(long_chat, user_id="m0-long")


def test_an_llm_config_of_your_own_is_kept(engine: MemoryEngine) -> None:
    own = {"provider": "openai", "config": {"model": "gpt-4.1-nano"}}
    assert mem0_inferscale.mem0_config(engine, llm=own)["llm"] is own
    assert mem0_inferscale.mem0_config(engine)["llm"].provider == "inferscale"


def test_capture_context_comes_from_mem0s_own_store(memory: Memory, engine: MemoryEngine,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The default quality policy captures each fact after its nearest facts. A Mem0 user
    # is unknown to the engine's own store: the neighbours come from Mem0's vector store.
    monkeypatch.setattr(engine, "config", engine.config.replace(
        capture_context=2, recompute_tail=0))
    user = "m0-context"
    texts = ["Mina grows tomatoes on her balcony.", "Mina's tomatoes won a prize in 2023.",
             "Mina works as a nurse in Leeds."]
    ids = [memory.add(text, user_id=user, infer=False)["results"][0]["id"] for text in texts]
    assert kv_is_missing(engine, user, dict(zip(ids, texts, strict=True))) == []
    reply = mem0_inferscale.answer(memory, "What does Mina grow?", user_id=user, k=3,
                                   max_tokens=4)
    assert sorted(reply.metrics.fact_ids) == sorted(ids)
    assert reply.metrics.recomputed_fact_ids == []
    engine.drop_kv(user, ids)
    assert mem0_inferscale.warm(memory, user_id=user) == 3
    assert kv_is_missing(engine, user, dict(zip(ids, texts, strict=True))) == []


def test_mem0s_capture_context_follows_the_engine_s_context_order(
        memory: Memory, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same neighbours in either order: oldest first, or least similar first. The
    # fact asked about was added last and its nearest neighbour first, so the orders differ.
    user = "m0-order"
    texts = ["Ola sails a small boat on the fjord.", "Ola teaches chemistry in Bergen.",
             "Ola repaints her boat every spring.", "Ola sails her small boat on the fjord."]
    ids = [memory.add(text, user_id=user, infer=False)["results"][0]["id"] for text in texts]
    store = memory.vector_store
    payload = store.inner.get(vector_id=ids[3]).payload
    vector = memory.embedding_model.embed(texts[3], "add")
    hits = store.inner.search(query=texts[3], vectors=vector, top_k=4,
                              filters={"user_id": user})
    nearest = [h.payload["data"] for h in hits if str(h.id) != ids[3]][:2]
    assert nearest[0] == texts[0]
    orders = {}
    for order in ("added", "similarity"):
        monkeypatch.setattr(engine, "config", engine.config.replace(
            capture_context=2, capture_context_order=order))
        orders[order] = store._neighbours(ids[3], payload, vector)
    assert list(orders["similarity"]) == nearest[::-1]
    assert list(orders["added"]) == sorted(nearest, key=texts.index)
    assert orders["added"] != orders["similarity"]


def test_another_users_identical_prompt_is_not_served_from_the_cache(
        memory: Memory, engine: MemoryEngine) -> None:
    words = "Mem's PIN is 4417, on a card in the blue drawer of the oak desk. " * (
        2 * engine.runtime.block_size // 20 + 1)

    def cached(user: str) -> int:
        result = mem0_inferscale.answer(memory, f"{words} What is the PIN?", user_id=user,
                                        max_tokens=1)
        assert result.metrics.fact_ids == []  # no memories
        return result.metrics.cached_tokens

    engine.reset_prefix_cache()
    cached("m0-salt-a")
    assert cached("m0-salt-a") > 0  # the user's own repeat
    assert cached("m0-salt-b") == 0  # another user's guess of it


# Mem0 scopes of some memories (user, agent and run ids, alone and combined).
SCOPED = {
    "Noor has a grey cat named Pixel.": {"agent_id": "m0-agent"},
    "Noor feeds her cat Pixel at seven.": {"run_id": "m0-run"},
    "Noor's cat Pixel sleeps on the piano.": {
        "user_id": "m0-user", "agent_id": "m0-agent", "run_id": "m0-run"},
    "Noor bought her cat Pixel a red collar.": {"user_id": "m0-user", "agent_id": "m0-agent"},
}


def test_every_mem0_scope_is_answered_with_its_memories_injected(
        memory: Memory, engine: MemoryEngine) -> None:
    ids = {text: memory.add(text, infer=False, **scope)["results"][0]["id"]
           for text, scope in SCOPED.items()}
    texts = list(SCOPED)

    def answered(**scope: Any) -> set[str]:
        reply = mem0_inferscale.answer(memory, "What about Noor's cat Pixel?", max_tokens=1,
                                       **scope)
        assert reply.metrics.recomputed_fact_ids == []  # each one's KV, captured by Mem0's add
        assert reply.metrics.injected_tokens > 0
        return set(reply.metrics.fact_ids)

    # Each scope finds what Mem0's search finds for it, keywords or filters alike.
    assert answered(filters={"agent_id": "m0-agent"}) == {ids[t] for t in texts[0::2] + [texts[3]]}
    assert answered(run_id="m0-run") == {ids[texts[1]], ids[texts[2]]}
    assert answered(agent_id="m0-agent", run_id="m0-run") == {ids[texts[2]]}
    assert answered(user_id="m0-user") == {ids[texts[2]], ids[texts[3]]}
    assert answered(filters={"user_id": "m0-user", "run_id": "m0-run"}) == {ids[texts[2]]}
    with pytest.raises(ValueError, match="user_id, agent_id or run_id"):
        mem0_inferscale.answer(memory, "What about Noor's cat?")
    with pytest.raises(ValueError, match="user_id"):
        mem0_inferscale.answer(memory, "What about Noor's cat?", user_id="m0-user",
                               filters={"user_id": "m0-agent"})

    # A memory of three scopes keeps its KV under each of them; delete evicts every copy.
    every = ids[texts[2]]
    memory.delete(every)
    for user in ("m0-user", "agent:m0-agent", "run:m0-run"):
        assert kv_is_missing(engine, user, {every: texts[2]}) == [every]


async def test_async_memory_is_answered_with_aanswer(engine: MemoryEngine,
                                                     tmp_path: Path) -> None:
    config = mem0_inferscale.mem0_config(engine, folder=str(tmp_path))
    amemory = mem0_inferscale.attach(AsyncMemory.from_config(config), engine)
    try:
        added = await asyncio.wait_for(amemory.add(
            "Tove rows on the lake every Sunday.", user_id="m0-async", infer=False), DEADLINE_S)
        reply = await asyncio.wait_for(mem0_inferscale.aanswer(
            amemory, "What does Tove do on Sundays?", user_id="m0-async", max_tokens=2),
            DEADLINE_S)
        assert reply.metrics.fact_ids == [added["results"][0]["id"]]
        assert reply.metrics.recomputed_fact_ids == [] and reply.metrics.injected_tokens > 0
        # Mem0's extraction (infer=True) runs in a worker thread of AsyncMemory.
        inferred = (await asyncio.wait_for(amemory.add(CHAT, user_id="m0-async-infer"),
                                           3 * DEADLINE_S))["results"]
        assert inferred and all(r["memory"].strip() for r in inferred)
        reply = await asyncio.wait_for(mem0_inferscale.aanswer(
            amemory, "Where does Dana live?", user_id="m0-async-infer", max_tokens=2),
            DEADLINE_S)
        assert set(reply.metrics.fact_ids) == {r["id"] for r in inferred}
        assert reply.metrics.recomputed_fact_ids == [] and reply.metrics.injected_tokens > 0
        with pytest.raises(TypeError, match="aanswer"):
            mem0_inferscale.answer(amemory, "What does Tove do?", user_id="m0-async")
        with pytest.raises(TypeError, match="answer"):
            await mem0_inferscale.aanswer(Memory.__new__(Memory), "Hi?", user_id="m0-async")
    finally:
        amemory.vector_store.client.close()
        amemory.close()


def ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith("langchain_inferscale") and r.levelno >= logging.WARNING]


def test_chat_model_warns_once_that_mem0s_facts_are_not_the_engines(
        memory: Memory, engine: MemoryEngine, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from langchain_inferscale import ChatInferScale, injection

    monkeypatch.setattr(injection, "_warned_two_memories", False)  # once per process
    memory.add("Ines moved to Porto.", user_id="m0-two", infer=False)
    engine.memory.add("Ines has a red bike.", user_id="m0-two-engine")
    assert mem0_inferscale.attached(engine)
    with caplog.at_level(logging.WARNING, logger="langchain_inferscale"):
        own = ChatInferScale(engine=engine, user_id="m0-two-engine", max_tokens=2).invoke("Hi")
        assert not ours(caplog)  # the engine's own user: nothing to say
        model = ChatInferScale(engine=engine, user_id="m0-two", max_tokens=2)
        first, second = model.invoke("Where do I live?"), model.invoke("Where do I live?")
    warnings = ours(caplog)
    assert len(warnings) == 1 and "Mem0" in warnings[0].getMessage()
    assert "mem0_inferscale.answer" in warnings[0].getMessage()
    assert own.response_metadata["memory"]["fact_ids"]
    assert first.response_metadata["memory"]["fact_ids"] == []
    assert "Mem0" in second.response_metadata["memory"]["without_memory"]

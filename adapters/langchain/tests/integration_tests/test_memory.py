"""ChatInferScale and InferScaleRetriever with facts on the real engine."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale, InferScaleRetriever

pytestmark = pytest.mark.engine
QUESTION = "Where does Caroline live?"


def memory_of(message: AIMessage) -> dict:
    return message.response_metadata["memory"]


def test_kv_answer_matches_the_text_path(engine: MemoryEngine,
                                         block_fact: Callable[[str], str]) -> None:
    fact = engine.memory.add(block_fact("Caroline moved to Berlin in May 2023."),
                             user_id="lc-exact")
    llm = ChatInferScale(engine=engine, user_id="lc-exact", k=1, max_tokens=16)
    engine.reset_prefix_cache()
    llm.invoke(QUESTION, mode="text")  # warms vLLM's prefix cache with header + fact
    text = llm.invoke(QUESTION, mode="text")
    kv = llm.invoke(QUESTION)
    assert memory_of(kv)["mode"] == "kv" and memory_of(text)["mode"] == "text"
    assert memory_of(kv)["fact_ids"] == [fact.id]
    assert memory_of(kv)["injected_tokens"] == engine.runtime.block_size
    assert memory_of(text)["injected_tokens"] == 0
    assert kv.content == text.content
    assert kv.usage_metadata["input_tokens"] == text.usage_metadata["input_tokens"]
    assert kv.usage_metadata["input_token_details"]["cache_read"] >= engine.runtime.block_size


def test_user_comes_from_the_call_config(engine: MemoryEngine) -> None:
    engine.memory.add("Bob's dog is called Rex.", user_id="lc-bob")
    llm = ChatInferScale(engine=engine, max_tokens=4)
    plain, bob = llm.batch(["What is my dog called?"] * 2,
                           config=[{}, {"configurable": {"user_id": "lc-bob", "k": 1}}])
    assert memory_of(plain)["user_id"] is None and memory_of(plain)["injected_tokens"] == 0
    assert memory_of(bob)["user_id"] == "lc-bob" and memory_of(bob)["injected_tokens"] > 0


def test_stream_ends_with_the_memory_metrics(engine: MemoryEngine) -> None:
    engine.memory.add("Ann plays the cello.", user_id="lc-stream")
    chunks = list(ChatInferScale(engine=engine, user_id="lc-stream", max_tokens=8)
                  .stream("What does Ann play?"))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert chunks[-1].chunk_position == "last"
    assert memory_of(chunks[-1])["injected_tokens"] > 0
    assert chunks[-1].usage_metadata["output_tokens"] > 0


async def test_async_calls_run_on_the_engine_loop(engine: MemoryEngine) -> None:
    engine.memory.add("Eve's favourite colour is green.", user_id="lc-async")
    llm = ChatInferScale(engine=engine, user_id="lc-async", max_tokens=8)
    message = await llm.ainvoke("What is Eve's favourite colour?")
    assert memory_of(message)["injected_tokens"] > 0
    chunks = [chunk async for chunk in llm.astream("What is Eve's favourite colour?")]
    assert memory_of(chunks[-1])["fact_ids"] == memory_of(message)["fact_ids"]
    assert "".join(c.text for c in chunks) == message.text


def test_deleted_facts_are_not_injected_nor_retrieved(engine: MemoryEngine) -> None:
    kept, dropped = engine.memory.add(["Liam lives in Oslo.", "Liam lives in Rome."],
                                      user_id="lc-delete")
    engine.memory.delete(dropped.id, user_id="lc-delete")
    reply = ChatInferScale(engine=engine, user_id="lc-delete", max_tokens=4).invoke(
        "Where does Liam live?")
    assert memory_of(reply)["fact_ids"] == [kept.id]
    retriever = InferScaleRetriever(engine=engine, user_id="lc-delete", k=5)
    assert [doc.id for doc in retriever.invoke("Where does Liam live?")] == [kept.id]


async def test_retriever_returns_the_user_facts_as_documents(engine: MemoryEngine) -> None:
    fact = engine.memory.add("Mia works as a nurse.", user_id="lc-retriever",
                             metadata={"source": "chat"})
    retriever = InferScaleRetriever(engine=engine, k=1)
    docs = await retriever.ainvoke("What is Mia's job?",
                                   config={"configurable": {"user_id": "lc-retriever"}})
    assert docs[0].page_content == fact.text and docs[0].id == fact.id
    assert docs[0].metadata["source"] == "chat" and docs[0].metadata["score"] > 0
    assert InferScaleRetriever(engine=engine, user_id="lc-nobody").invoke("job?") == []


def test_user_without_facts_is_answered_without_memory(engine: MemoryEngine) -> None:
    llm = ChatInferScale(engine=engine, user_id="lc-new-user", max_tokens=4)
    for reply in (llm.invoke("Hi"), functools.reduce(operator.add, llm.stream("Hi"))):
        assert memory_of(reply)["injected_tokens"] == 0 and reply.content
        assert memory_of(reply)["memory_used"] is False
        assert "has no facts" in memory_of(reply)["without_memory"]


def test_agent_run_config_names_the_user(engine: MemoryEngine) -> None:
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    fact = engine.memory.add("Zoe's cat is called Miso.", user_id="lc-agent")
    agent = create_agent(ChatInferScale(engine=engine, max_tokens=6), tools=[],
                         checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "lc-agent-1", "user_id": "lc-agent"}}
    for question in ("What is my cat called?", "Say it again."):
        state = agent.invoke({"messages": [("user", question)]}, config)
    assert len(state["messages"]) == 4  # the checkpointer kept the thread
    assert memory_of(state["messages"][-1])["fact_ids"] == [fact.id]


async def test_a_timeout_says_what_ran_out(engine: MemoryEngine) -> None:
    engine.memory.add("Otto rows on the lake at dawn.", user_id="lc-timeout")
    model = ChatInferScale(engine=engine, user_id="lc-timeout", max_tokens=64,
                           timeout=0.001)
    late = pytest.raises(TimeoutError, match=r"no answer within 0.001 s")
    with late:
        model.invoke("When does Otto row?")
    with late:
        await model.ainvoke("When does Otto row?")
    with late:  # streams too: no first chunk comes in time
        list(model.stream("When does Otto row?"))
    with late:
        [chunk async for chunk in model.astream("When does Otto row?")]


def test_another_users_identical_prompt_is_not_served_from_the_cache(
        engine: MemoryEngine) -> None:
    words = "Lang's PIN is 4417, on a card in the blue drawer of the oak desk. " * (
        2 * engine.runtime.block_size // 20 + 1)

    def cached(user: str) -> int:
        reply = ChatInferScale(engine=engine, user_id=user, max_tokens=1).invoke(
            f"{words} What is the PIN?")
        assert reply.usage_metadata is not None
        # No facts: nothing injected, so what was read from a cache is vLLM's prefix cache.
        return int(reply.usage_metadata["input_token_details"]["cache_read"])

    engine.reset_prefix_cache()
    cached("lc-salt-a")
    assert cached("lc-salt-a") > 0  # the user's own repeat
    assert cached("lc-salt-b") == 0  # another user's guess of it


def test_sampling_parameters_reach_vllm(engine: MemoryEngine) -> None:
    question = "Name three colours."
    greedy = ChatInferScale(engine=engine, max_tokens=16).invoke(question).content
    sampled = ChatInferScale(engine=engine, max_tokens=16, temperature=1.0, seed=7)
    assert sampled.invoke(question).content != greedy  # sampling at temperature 1
    # top-k 1 or a tiny top-p keep only the most likely token: the greedy answer again.
    assert ChatInferScale(engine=engine, max_tokens=16, temperature=1.0, seed=7,
                          top_k=1).invoke(question).content == greedy
    assert sampled.invoke(question, top_p=1e-9).content == greedy
    penalised = sampled.invoke(question, top_k=1, presence_penalty=2.0, frequency_penalty=2.0)
    assert penalised.content  # accepted (and checked by the engine)


def test_unknown_parameters_are_refused_at_construction_and_call(engine: MemoryEngine) -> None:
    import pydantic

    for bad in ({"model_kwargs": {"top_p": 0.9}}, {"top_q": 0.9}):
        with pytest.raises(pydantic.ValidationError):
            ChatInferScale(engine=engine, **bad)
    with pytest.raises(ValueError, match="unknown call options"):
        ChatInferScale(engine=engine).invoke("Hi", top_q=0.9)


def test_an_answer_without_memory_says_why(engine: MemoryEngine) -> None:
    engine.memory.add("Cleo's cat is called Miso.", user_id="lc-why")
    llm = ChatInferScale(engine=engine, max_tokens=2)
    nobody, unknown, known = llm.batch(["What is my cat called?"] * 3, config=[
        {}, {"configurable": {"user_id": "lc-why-nobody"}},
        {"configurable": {"user_id": "lc-why"}}])
    assert "no user_id" in memory_of(nobody)["without_memory"]
    assert "has no facts" in memory_of(unknown)["without_memory"]
    assert memory_of(unknown)["user_id"] == "lc-why-nobody"
    assert memory_of(known)["without_memory"] is None and memory_of(known)["fact_ids"]


def test_a_fact_pasted_by_the_chain_is_not_also_injected(engine: MemoryEngine) -> None:
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    lives, cat = engine.memory.add(["Nora lives in Lisbon.", "Nora has a cat named Pixel."],
                                   user_id="lc-chain")
    retriever = InferScaleRetriever(engine=engine, k=1)
    model = ChatInferScale(engine=engine, k=2, max_tokens=4)
    prompt = ChatPromptTemplate.from_messages([("system", "Facts:\n{facts}"),
                                               ("human", "{question}")])
    chain = ({"facts": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
              "question": RunnablePassthrough()} | prompt | model)
    config = {"configurable": {"user_id": "lc-chain"}}
    question = "Where does Nora live?"

    pasted = retriever.invoke(question, config=config)
    assert [doc.metadata["inferscale_fact_id"] for doc in pasted] == [pasted[0].id]
    injected = {lives.id, cat.id} - {pasted[0].id}
    reply = chain.invoke(question, config=config)
    assert memory_of(reply)["skipped_in_prompt"] == [pasted[0].id]
    assert set(memory_of(reply)["fact_ids"]) == injected  # the other fact is still injected
    assert memory_of(reply)["without_memory"] is None

    plain = model.invoke(question, config=config)  # nothing pasted: both are injected
    assert set(memory_of(plain)["fact_ids"]) == {lives.id, cat.id}
    assert memory_of(plain)["skipped_in_prompt"] == []


async def test_async_and_streaming_calls_skip_pasted_facts(engine: MemoryEngine) -> None:
    fact = engine.memory.add("Omar plays the oboe.", user_id="lc-chain-async")
    model = ChatInferScale(engine=engine, user_id="lc-chain-async", k=1, max_tokens=4)
    pasted = [("system", f"Facts:\n- {fact.text}"), ("human", "What does Omar play?")]
    for reply in (await model.ainvoke(pasted), list(model.stream(pasted))[-1],
                  [chunk async for chunk in model.astream(pasted)][-1]):
        assert memory_of(reply)["skipped_in_prompt"] == [fact.id]
        assert memory_of(reply)["fact_ids"] == []
        assert "in the prompt" in memory_of(reply)["without_memory"]

"""End-to-end behaviour of the KV path on the real engine and the real SmolLM2 model."""

from __future__ import annotations

import time

import pytest

from inferscale_memory import (
    ChatResult,
    ContextLengthError,
    FactNotFoundError,
    InvalidInputError,
    MemoryEngine,
    UnknownUserError,
)
from inferscale_memory.connector.params import FactKey, RequestParams, Span

pytestmark = pytest.mark.engine

QUESTIONS = ["Where does Caroline live?",
             "I am planning a trip and want to visit her. Please think about everything you "
             "know about her, including where she lives now. Where does Caroline live?"]


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def block_fact(engine: MemoryEngine, sentence: str, blocks: int = 1) -> str:
    """``sentence`` padded so that header + fact fill exactly ``blocks`` KV blocks.

    The text path then finds header + fact in vLLM's own prefix cache, so both paths
    compute the rest of the prompt in the same chunk: vLLM's CPU kernels are not batch
    invariant (a prompt prefilled in one go and the same prompt with a cached prefix differ
    in the last bits), so only equal chunking makes the comparison exact.
    """
    target = blocks * engine.runtime.block_size - len(engine.builder.header_ids)
    words = sentence.rstrip(".").split()
    filler = ["and", "she", "keeps", "a", "small", "notebook", "about", "it"]
    for extra in range(0, 400):
        for oks in range(4):
            text = " ".join(words + (filler * 60)[:extra]) + " ok" * oks + "."
            if len(engine.builder.fact_ids(text)) == target:
                return text
    raise AssertionError("no padding reaches the block boundary")


def warm_text(engine: MemoryEngine, question: list[dict[str, str]], **kwargs: object
              ) -> tuple[ChatResult, ChatResult]:
    """The text path twice: a fresh prefill, then the same prompt on a warm prefix cache."""
    engine.reset_prefix_cache()
    fresh = engine.chat(question, mode="text", **kwargs)  # type: ignore[arg-type]
    warm = engine.chat(question, mode="text", **kwargs)  # type: ignore[arg-type]
    assert fresh.metrics.cached_tokens == 0
    assert warm.metrics.cached_tokens >= engine.runtime.block_size
    return fresh, warm


def assert_same_answer(kv: ChatResult, text: ChatResult) -> None:
    assert kv.prompt_token_ids == text.prompt_token_ids
    assert kv.token_ids == text.token_ids
    assert kv.logprobs is not None and text.logprobs is not None
    assert kv.logprobs[0] == text.logprobs[0]


@pytest.mark.parametrize("question", QUESTIONS)
def test_single_fact_injected_where_captured_is_exact(engine: MemoryEngine, question: str,
                                                      record_property: pytest.RecordProperty
                                                      ) -> None:
    user = f"exact-{QUESTIONS.index(question)}"
    engine.memory.add(block_fact(engine, "Caroline moved to Berlin in May 2023."), user_id=user)
    options = dict(user_id=user, k=1, max_tokens=32, logprobs=5)
    fresh, warm = warm_text(engine, ask(question), **options)
    kv = engine.chat(ask(question), mode="kv", **options)  # type: ignore[arg-type]
    assert kv.metrics.injected_tokens == engine.runtime.block_size  # header + fact
    assert kv.metrics.computed_tokens == kv.metrics.prompt_tokens - engine.runtime.block_size
    assert kv.metrics.recomputed_fact_ids == []
    assert_same_answer(kv, warm)
    # Recorded, not asserted: vLLM's own prefix caching vs a one-shot prefill.
    record_property("fresh_equals_warm_logprobs", fresh.logprobs == warm.logprobs)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_kv_and_text_prompts_have_identical_token_ids(engine: MemoryEngine, k: int) -> None:
    facts = [f"Nadia owns {n} paintings of the sea, number {n}." for n in range(1, 6)]
    if not engine.store.has_user("tokens"):
        engine.memory.add(facts, user_id="tokens")
    text = engine.chat(ask("What does Nadia own?"), user_id="tokens", k=k, mode="text",
                       max_tokens=1)
    kv = engine.chat(ask("What does Nadia own?"), user_id="tokens", k=k, mode="kv",
                     max_tokens=1)
    assert kv.prompt_token_ids == text.prompt_token_ids
    assert kv.metrics.fact_ids == text.metrics.fact_ids
    assert len(kv.metrics.fact_ids) == k
    assert kv.metrics.injected_tokens > kv.metrics.memory_tokens  # header + every fact


def test_several_facts_agreement_is_measured(engine: MemoryEngine,
                                             record_property: pytest.RecordProperty) -> None:
    facts = ["Tom plays the trumpet in a jazz band.", "Tom's daughter is called Mia.",
             "Tom lives in Oslo.", "Tom is vegetarian.", "Tom studied physics in Leeds."]
    engine.memory.add(facts, user_id="several")
    questions = ["What instrument does Tom play?", "Where does Tom live?",
                 "What is Tom's daughter called?", "What did Tom study?"]
    agree = 0
    for question in questions:
        text = engine.chat(ask(question), user_id="several", k=5, mode="text", max_tokens=16)
        kv = engine.chat(ask(question), user_id="several", k=5, mode="kv", max_tokens=16)
        assert kv.metrics.recomputed_fact_ids == []
        agree += kv.token_ids == text.token_ids
    record_property("greedy_agreement_k5", f"{agree}/{len(questions)}")
    print(f"greedy agreement KV vs text, 5 facts: {agree}/{len(questions)}")


def test_plain_request_never_reuses_injected_blocks(engine: MemoryEngine) -> None:
    facts = [f"Ines keeps note {n}: the blue folder holds the receipts of {1990 + n}."
             for n in range(12)]
    ids = [f.id for f in engine.memory.add(facts, user_id="isolation")]
    stored = [engine.store.get(i, user_id="isolation") for i in ids]
    kv = engine.answer(ask(QUESTIONS[1]), stored, user_id="isolation", mode="kv",
                       max_tokens=4, logprobs=5)
    assert kv.metrics.injected_tokens >= 128  # at least one full block entered the cache
    after = engine.answer(ask(QUESTIONS[1]), stored, user_id="isolation", mode="text",
                          max_tokens=4, logprobs=5)
    assert after.metrics.cached_tokens == 0 and after.metrics.injected_tokens == 0
    engine.reset_prefix_cache()
    fresh = engine.answer(ask(QUESTIONS[1]), stored, user_id="isolation", mode="text",
                          max_tokens=4, logprobs=5)
    assert fresh.metrics.cached_tokens == 0
    assert after.logprobs == fresh.logprobs and after.token_ids == fresh.token_ids


def test_user_cannot_inject_another_users_fact(engine: MemoryEngine) -> None:
    secret = engine.memory.add("Bob's locker code is 4812.", user_id="bob")
    engine.memory.add("Alice likes tea.", user_id="alice")
    with pytest.raises(InvalidInputError):
        engine.answer(ask("What is Bob's locker code?"), [secret], user_id="alice")
    assert all(f.fact.user_id == "alice" for f in
               engine.chat(ask("What is Bob's locker code?"), user_id="alice", k=5).facts)
    # A forged low-level request: alice's user naming bob's fact over bob's tokens.
    layout = engine.builder.build(ask("What is Bob's locker code?"), [(secret.id, secret.text)])
    forged = RequestParams("alice", layout.layout_id, inject=(
        Span(FactKey("", engine.builder.header_name), 0, layout.header_end),
        Span(FactKey("bob", secret.id), *layout.fact_spans[0][1:])))
    done = engine.arun(engine.runtime.complete(layout.token_ids, max_tokens=1, params=forged))
    assert done.report.injected_tokens == 0 and done.report.error
    # Alice's own key over bob's tokens: the token digest does not match anything of hers.
    mine = RequestParams("alice", layout.layout_id, inject=(
        Span(FactKey("", engine.builder.header_name), 0, layout.header_end),
        Span(FactKey("alice", secret.id), *layout.fact_spans[0][1:])))
    done = engine.arun(engine.runtime.complete(layout.token_ids, max_tokens=1, params=mine))
    assert done.report.missing == (FactKey("alice", secret.id),)


def test_lifecycle_add_update_delete(engine: MemoryEngine) -> None:
    question = ask("What is Kenji's favourite colour?")
    options = dict(user_id="kenji", k=3, max_tokens=12, logprobs=5)
    fact = engine.memory.add(block_fact(engine, "Kenji's favourite colour is green."),
                             user_id="kenji")
    kv = engine.chat(question, mode="kv", **options)  # type: ignore[arg-type]
    assert kv.metrics.fact_ids == [fact.id] and kv.metrics.recomputed_fact_ids == []
    assert_same_answer(kv, warm_text(engine, question, **options)[1])

    new_text = block_fact(engine, "Kenji's favourite colour is purple.")
    engine.memory.update(fact.id, new_text, user_id="kenji")
    kv = engine.chat(question, mode="kv", **options)  # type: ignore[arg-type]
    assert kv.facts[0].fact.text == new_text
    assert kv.metrics.recomputed_fact_ids == []  # the new text's KV was captured...
    assert_same_answer(kv, warm_text(engine, question, **options)[1])  # ...and injected

    engine.memory.delete(fact.id, user_id="kenji")
    with pytest.raises(FactNotFoundError):
        engine.memory.get(fact.id, user_id="kenji")
    third = engine.chat(question, user_id="kenji", k=3, max_tokens=12)
    assert third.metrics.fact_ids == [] and third.facts == []
    layout = engine.builder.build(question, [(fact.id, new_text)])
    forged = RequestParams("kenji", layout.layout_id, inject=(
        Span(FactKey("", engine.builder.header_name), 0, layout.header_end),
        Span(FactKey("kenji", fact.id), *layout.fact_spans[0][1:])))
    done = engine.arun(engine.runtime.complete(layout.token_ids, max_tokens=1, params=forged))
    assert done.report.missing == (FactKey("kenji", fact.id),)  # evicted from the engine too


def test_missing_kv_is_recomputed_and_reported(engine: MemoryEngine) -> None:
    # One add per fact: facts captured together share engine steps, and on vLLM's CPU
    # kernels a prefill's last bits depend on what else is in the batch.
    kept = engine.memory.add(block_fact(engine, "Lena's cat is named Pixel."), user_id="missing")
    dropped = engine.memory.add("Pixel is nine years old.", user_id="missing")
    question = ask("How old is Lena's cat Pixel?")
    facts = [dropped, kept]  # best first: the prompt holds kept, then dropped
    options = dict(user_id="missing", max_tokens=16, logprobs=5)
    engine.drop_kv("missing", [dropped.id])
    engine.reset_prefix_cache()
    engine.answer(question, facts, mode="text", **options)  # warms header + kept
    text = engine.answer(question, facts, mode="text", **options)
    recomputed = engine.answer(question, facts, mode="kv", **options)
    assert recomputed.metrics.recomputed_fact_ids == [dropped.id]
    assert recomputed.metrics.injected_fact_ids == [kept.id]
    assert recomputed.metrics.injected_tokens == engine.runtime.block_size
    assert_same_answer(recomputed, text)
    engine.wait_for_background()  # the dropped fact is recaptured after the answer
    again = engine.answer(question, facts, mode="kv", **options)
    assert again.metrics.recomputed_fact_ids == []
    assert again.metrics.injected_fact_ids == [kept.id, dropped.id]
    # header + kept now come from the prefix cache of this user; dropped is injected again
    assert again.metrics.injected_tokens == len(engine.builder.fact_ids(dropped.text))
    assert again.metrics.computed_tokens < recomputed.metrics.computed_tokens


def test_ignore_eos_generates_exactly_max_tokens(engine: MemoryEngine) -> None:
    # The throughput benchmark relies on it: both paths must decode the same amount.
    question = ask("Say yes.")
    engine.memory.add("Nora likes short answers.", user_id="nora")
    for mode in ("kv", "text"):
        result = engine.chat(question, user_id="nora", k=1, mode=mode, max_tokens=40,
                             ignore_eos=True)
        assert result.metrics.output_tokens == 40


def test_streaming_yields_the_same_answer(engine: MemoryEngine) -> None:
    engine.memory.add("Priya's bike is red.", user_id="stream")
    chunks = list(engine.stream_chat(ask("What colour is Priya's bike?"), user_id="stream",
                                     max_tokens=12))
    final = chunks[-1].result
    assert final is not None
    assert "".join(c.text for c in chunks) == final.text
    assert final.text == engine.chat(ask("What colour is Priya's bike?"), user_id="stream",
                                     max_tokens=12).text


async def test_a_timeout_covers_the_first_chunk_and_the_whole_stream(
        engine: MemoryEngine) -> None:
    engine.memory.add("Tess paints lighthouses.", user_id="timeout")
    question = ask("What does Tess paint?")
    options = dict(user_id="timeout", max_tokens=64, ignore_eos=True)
    late = pytest.raises(TimeoutError, match=r"no answer within 0.001 s")
    with late:
        engine.chat(question, timeout=0.001, **options)  # type: ignore[arg-type]
    with late:
        await engine.achat(question, timeout=0.001, **options)
    with late:  # no first chunk comes in time
        next(engine.stream_chat(question, timeout=0.001, **options))
    with late:
        [c async for c in engine.astream_chat(question, timeout=0.001, **options)]
    # A first chunk in time, then a slow reader: the rest of the stream is past the limit.
    chunks = engine.stream_chat(question, timeout=3, **options)
    assert next(chunks).result is None
    time.sleep(3)
    with pytest.raises(TimeoutError, match=r"no answer within 3.0 s"):
        list(chunks)
    deadline = time.monotonic() + 10  # every timed-out request was aborted in vLLM
    while engine.runtime.unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.runtime.unfinished_requests() == 0
    whole = engine.chat(question, timeout=120, **options)  # type: ignore[arg-type]
    assert whole.metrics.output_tokens == 64
    for bad in (0, -1, True, "5", float("nan")):
        with pytest.raises(InvalidInputError, match="timeout"):
            engine.chat(question, timeout=bad, **options)  # type: ignore[arg-type]


async def test_a_user_without_facts_is_answered_without_memory(engine: MemoryEngine) -> None:
    question = ask("Say hello to me.")
    plain = engine.chat(question, max_tokens=4)  # no user: the plain conversation
    engine.memory.add("Wim grows tulips.", user_id="no-facts-left")
    engine.memory.delete_all(user_id="no-facts-left")  # a user whose facts are all gone
    for user in ("no-facts-yet", "no-facts-left"):
        streamed = list(engine.stream_chat(question, user_id=user, max_tokens=4))
        astreamed = [c async for c in engine.astream_chat(question, user_id=user,
                                                          max_tokens=4)]
        for reply in (engine.chat(question, user_id=user, max_tokens=4),
                      await engine.achat(question, user_id=user, max_tokens=4),
                      engine.answer(question, [], user_id=user, max_tokens=4),
                      streamed[-1].result, astreamed[-1].result):
            assert reply is not None and reply.text
            assert reply.metrics.memory_used is False
            assert reply.metrics.fact_ids == [] and reply.facts == []
            assert reply.metrics.injected_tokens == 0 and reply.metrics.memory_tokens == 0
            assert reply.prompt_token_ids == plain.prompt_token_ids
    with pytest.raises(UnknownUserError):  # reading the facts of a user without any
        engine.memory.list(user_id="no-facts-yet")
    engine.memory.add("Wim grows tulips.", user_id="no-facts-left")
    reply = engine.chat(ask("What does Wim grow?"), user_id="no-facts-left", max_tokens=4)
    assert reply.metrics.memory_used is True and reply.metrics.injected_tokens > 0
    # memory=False: the same user, who has a fact now, answered without it
    off = engine.chat(question, user_id="no-facts-left", memory=False, max_tokens=4)
    assert off.metrics.memory_used is False and off.facts == []
    assert off.metrics.injected_tokens == 0 and off.prompt_token_ids == plain.prompt_token_ids
    with pytest.raises(InvalidInputError):  # given facts are memory
        engine.answer(question, reply.facts, user_id="no-facts-left", memory=False)
    with pytest.raises(InvalidInputError):
        engine.chat(question, user_id="no-facts-left", memory="off")


def test_bad_input_is_refused_and_changes_nothing(engine: MemoryEngine) -> None:
    engine.memory.add("Sven collects stamps.", user_id="bad")
    before = engine.memory.list(user_id="bad")
    with pytest.raises(InvalidInputError):
        engine.memory.add("   ", user_id="bad")
    with pytest.raises(InvalidInputError):
        engine.memory.add("word " * 2000, user_id="bad")
    with pytest.raises(InvalidInputError):
        engine.memory.add(["fine fact", ""], user_id="bad")
    for k in (0, -1, True, 2.5):
        with pytest.raises(InvalidInputError):
            engine.chat(ask("What does Sven collect?"), user_id="bad", k=k)
    with pytest.raises(ContextLengthError):
        engine.chat(ask("tell me more " * 3000), user_id="bad")
    with pytest.raises(InvalidInputError):
        engine.chat([{"role": "robot", "content": "hi"}], user_id="bad")
    with pytest.raises(InvalidInputError):
        engine.chat(ask("hi"), user_id="bad", mode="telepathy")
    assert engine.memory.list(user_id="bad") == before
    assert "stamp" in engine.chat(ask("What does Sven collect?"), user_id="bad",
                                  max_tokens=12).text.lower()

"""The answer-quality levers on the real engine: prompt order, tail recompute, context capture.

All on the shared session engine: the levers are per-call arguments (``fact_order``,
``recompute_tail``) or read from ``engine.config`` when a fact is captured
(``capture_context``, patched here for one test).
"""

from __future__ import annotations

import pytest
from test_engine import ask, assert_same_answer, block_fact

from inferscale_memory import Fact, InvalidInputError, MemoryConfig, MemoryEngine
from inferscale_memory.config import QUALITY_FIELDS
from inferscale_memory.layout import tail_size

pytestmark = pytest.mark.engine


def padded(engine: MemoryEngine, sentence: str, tokens: int) -> str:
    """``sentence`` padded to exactly ``tokens`` fact tokens."""
    words = sentence.rstrip(".").split()
    filler = ["and", "it", "is", "noted", "in", "the", "small", "book"]
    for extra in range(400):
        for oks in range(4):
            text = " ".join(words + (filler * 60)[:extra]) + " ok" * oks + "."
            if len(engine.builder.fact_ids(text)) == tokens:
                return text
    raise AssertionError(f"no padding gives {tokens} tokens")


def warm_text_answer(engine: MemoryEngine, question: list[dict[str, str]], facts: list,
                     **options: object):
    """The text path on a warm prefix cache (full blocks of header + facts cached)."""
    engine.reset_prefix_cache()
    engine.answer(question, facts, mode="text", **options)  # type: ignore[arg-type]
    return engine.answer(question, facts, mode="text", **options)  # type: ignore[arg-type]


def test_fact_order_time_puts_the_oldest_fact_first(engine: MemoryEngine) -> None:
    texts = ["Maya started violin lessons in 2019.", "Maya joined an orchestra in 2021.",
             "Maya played her first solo concert in 2023."]
    added = [engine.memory.add(text, user_id="order") for text in texts]
    best_first = [added[1], added[2], added[0]]
    question = ask("When did Maya start the violin?")
    by_time = engine.answer(question, best_first, user_id="order", mode="text", max_tokens=1,
                            fact_order="time")
    by_rank = engine.answer(question, best_first, user_id="order", mode="text", max_tokens=1)
    assert by_time.metrics.fact_ids == [f.id for f in added]
    assert by_rank.metrics.fact_ids == [added[0].id, added[2].id, added[1].id]
    prompt = engine.tokenizer.decode(by_time.prompt_token_ids)
    assert prompt.index(texts[0]) < prompt.index(texts[1]) < prompt.index(texts[2])
    prompt = engine.tokenizer.decode(by_rank.prompt_token_ids)
    assert prompt.index(texts[0]) < prompt.index(texts[2]) < prompt.index(texts[1])


def test_recompute_tail_injects_every_fact_but_the_last_r(engine: MemoryEngine) -> None:
    facts = [f"Nora's shelf {n} holds {n + 3} books about birds." for n in range(4)]
    engine.memory.add(facts, user_id="tail-count")
    question = ask("How many bird books does Nora have?")
    found = engine.memory.search(question[0]["content"], user_id="tail-count", k=4)
    header = len(engine.builder.header_ids)
    for tail in (0, 1, 3, 4, 9):
        engine.reset_prefix_cache()
        kv = engine.answer(question, found, user_id="tail-count", mode="kv", max_tokens=1,
                           recompute_tail=tail)
        named = kv.facts[:max(0, len(kv.facts) - tail)]
        # A tail of every fact injects nothing, the header neither: the text path's request.
        expected = header + sum(len(engine.builder.fact_ids(f.fact.text)) for f in named) \
            if named or tail == 0 else 0
        assert kv.metrics.injected_tokens == expected, tail
        assert kv.metrics.computed_tokens == kv.metrics.prompt_tokens - expected
        assert kv.metrics.recomputed_fact_ids == []
        assert kv.metrics.injected_fact_ids == [f.fact.id for f in named]


def test_recompute_tail_answers_like_the_text_path(engine: MemoryEngine) -> None:
    # header + kept fill one block, so the text path's warm prefix cache and the KV path
    # both compute from the block boundary: the tail fact sees `kept` on both paths.
    kept = engine.memory.add(block_fact(engine, "Lena's cat is named Pixel."),
                             user_id="tail-exact")
    tail = engine.memory.add("Pixel is nine years old.", user_id="tail-exact")
    question = ask("How old is Lena's cat Pixel?")
    facts = [tail, kept]  # best first: the prompt holds kept, then tail
    options = dict(user_id="tail-exact", max_tokens=16, logprobs=5)
    text = warm_text_answer(engine, question, facts, **options)
    kv = engine.answer(question, facts, mode="kv", recompute_tail=1, **options)  # type: ignore[arg-type]
    assert kv.metrics.injected_tokens == engine.runtime.block_size  # header + kept
    assert kv.metrics.recomputed_fact_ids == []
    assert_same_answer(kv, text)


def assert_injected_after_first_like_text(engine: MemoryEngine, first: Fact, second: Fact,
                                          user_id: str) -> None:
    """``second``, captured right after ``first`` (each one block), injected after it
    answers bit for bit like the text path."""
    question = ask("How old is Omar's cat?")
    options = dict(user_id=user_id, max_tokens=16, logprobs=5, fact_order="time",
                   recompute_tail=0)
    # The capture of `second` found header + first (one block) in vLLM's prefix cache and
    # computed `second` after it. vLLM's CPU kernels give other last bits for a prefix
    # served from the cache, so the text path is brought to the same state: block 0 from a
    # prompt that holds only `first`, then `second` computed after the cached block.
    engine.reset_prefix_cache()
    engine.answer(question, [first], mode="text", **options)  # type: ignore[arg-type]
    engine.answer(question, [second, first], mode="text", **options)  # type: ignore[arg-type]
    text = engine.answer(question, [second, first], mode="text", **options)  # type: ignore[arg-type]
    assert text.metrics.cached_tokens == 2 * engine.runtime.block_size
    kv = engine.answer(question, [second, first], mode="kv", **options)  # type: ignore[arg-type]
    # Both facts injected; `second` was captured right after `first`, where it sits in
    # the prompt, so its KV is the text path's and the answers agree bit for bit.
    assert kv.metrics.fact_ids == [first.id, second.id]
    assert kv.metrics.injected_tokens == 2 * engine.runtime.block_size
    assert_same_answer(kv, text)


@pytest.fixture
def default_policy(engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch) -> MemoryConfig:
    """The shared engine with the library's default quality policy (it runs without)."""
    defaults = MemoryConfig()
    policy = {name: getattr(defaults, name) for name in QUALITY_FIELDS}
    monkeypatch.setattr(engine, "config", engine.config.replace(**policy))
    return engine.config


def test_default_policy_injects_all_but_a_tail_and_computes_small_k_as_text(
        engine: MemoryEngine, default_policy: MemoryConfig) -> None:
    tail = default_policy.recompute_tail
    assert tail > 0 and default_policy.capture_context > 0
    facts = [f"Nora's shelf {n} holds {n + 3} books about {bird}." for n, bird in
             enumerate(["owls", "gulls", "crows", "herons", "swifts", "wrens", "kites",
                        "terns", "rooks", "larks"])]
    engine.memory.add(facts, user_id="policy")
    question = ask("How many books about herons does Nora have?")
    found = engine.memory.search(question[0]["content"], user_id="policy", k=len(facts))
    header = len(engine.builder.header_ids)
    options = dict(user_id="policy", max_tokens=12, logprobs=3)
    for k in (1, 3, tail + 1, tail + 2, len(facts)):
        computed = tail_size(k, tail, captured_alone=False)
        engine.reset_prefix_cache()
        before = engine.kv_stats.injected
        kv = engine.answer(question, found[:k], mode="kv", **options)  # type: ignore[arg-type]
        lengths = [len(engine.builder.fact_ids(f.fact.text)) for f in kv.facts]
        assert len(lengths) == k
        if computed == k:  # nothing but the header would be injected: the text path exactly
            assert k <= tail + 1
            assert kv.metrics.injected_tokens == 0 and engine.kv_stats.injected == before
            engine.reset_prefix_cache()
            text = engine.answer(question, found[:k], mode="text", **options)  # type: ignore[arg-type]
            assert_same_answer(kv, text)
        else:  # the header and the first k - tail facts injected, the last `tail` computed
            assert computed == tail
            injected = header + sum(lengths[:k - tail])
            assert kv.metrics.injected_tokens == injected, k
            assert kv.metrics.computed_tokens == kv.metrics.prompt_tokens - injected
            assert engine.kv_stats.injected == before + k - tail
        assert kv.metrics.recomputed_fact_ids == []


def test_similar_context_captures_a_fact_after_its_nearest_fact(
        engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "config", engine.config.replace(
        capture_context=1))
    first = engine.memory.add(block_fact(engine, "Omar adopted a grey cat in 2019."),
                              user_id="near")
    engine.memory.add("The night train to Lisbon leaves at ten.", user_id="near")
    second = engine.memory.add(
        padded(engine, "Omar's grey cat, called Ash, turned four in June 2023.",
               engine.runtime.block_size), user_id="near")
    # `second` was added after the train fact, but its nearest fact is `first`: it was
    # captured right after `first`, which is where it sits in the prompt. With the most
    # recent fact as its context it would have attended to the train fact instead.
    assert_injected_after_first_like_text(engine, first, second, "near")


@pytest.mark.parametrize("options", [{"fact_order": "random"}, {"recompute_tail": -1},
                                     {"recompute_tail": True}, {"recompute_tail": "2"}])
def test_bad_quality_options_are_refused(engine: MemoryEngine, options: dict) -> None:
    engine.memory.add("Ivo bakes bread on Sundays.", user_id="quality-bad")
    with pytest.raises(InvalidInputError):
        engine.chat(ask("When does Ivo bake?"), user_id="quality-bad", max_tokens=1,
                    **options)


def test_facts_from_another_store_are_recaptured_with_context_capture_on(
        engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Facts handed to answer() by another store (Mem0's, say): their user has no fact in
    # the engine's store. Missing KV is computed in the answer and recaptured in the
    # background; with context capture on, that recapture once listed the engine's store
    # for the context and failed with UnknownUserError.
    monkeypatch.setattr(engine, "config", engine.config.replace(
        capture_context=2))
    facts = [Fact(id=f"elsewhere-{n}", user_id="elsewhere", text=text, metadata={},
                  created_at=float(n), updated_at=float(n))
             for n, text in enumerate(["Rui grows basil on the balcony.",
                                       "Rui's basil needs water every day.",
                                       "Rui moved to Porto in 2022."])]
    question = ask("What does Rui grow?")
    first = engine.answer(question, facts, user_id="elsewhere", max_tokens=4)
    assert sorted(first.metrics.recomputed_fact_ids) == sorted(f.id for f in facts)
    engine.wait_for_background()
    again = engine.answer(question, facts, user_id="elsewhere", max_tokens=4)
    assert again.metrics.recomputed_fact_ids == []
    assert sorted(again.metrics.injected_fact_ids) == sorted(f.id for f in facts)

"""A fact-KV pool ten times smaller than the facts: answers stay right, memory stays bounded.

A second engine (the shared one has an ample pool) with ``kv_pool_gb`` sized for a few
facts. Facts are captured as they are added; least recently used ones are evicted; an
answer naming an evicted fact computes it from text (and recaptures it in the
background), and its greedy answer equals the text path's.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine

NAMES = ["Ada", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kai", "Lu"]
THINGS = ["violin", "kayak", "garden", "telescope", "bakery", "chess club"]


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryEngine]:
    store = tmp_path_factory.mktemp("budget") / "memory.sqlite"
    # About 70 token rows of SmolLM2's KV (23 KiB a token in bf16): the header and a few
    # facts of ~12 tokens.
    with MemoryEngine(store_path=str(store), kv_cache_gb=1, max_model_len=1024,
                      kv_pool_gb=0.0015) as engine:
        yield engine


def test_ten_times_more_fact_kv_than_the_budget(small_pool: MemoryEngine) -> None:
    engine = small_pool
    facts = engine.memory.add(
        [f"{name} spends every Monday at the {thing}." for name in NAMES for thing in THINGS],
        user_id="budget")
    stats = engine.kv_stats
    budget = stats.budget_tokens
    assert budget is not None
    sizes = [len(engine.builder.fact_ids(f.text)) for f in facts]
    assert sum(sizes) >= 10 * budget
    # Captures that found no room even after evictions were skipped (recomputed on use).
    kept = stats.captured - 1 - stats.evicted  # the header is captured once, never evicted
    assert stats.evicted >= 1 and kept > 0 and kept * min(sizes) <= budget
    assert stats.pool_tokens <= budget

    rng = random.Random(1)
    for fact in rng.sample(facts, 5):
        question = [{"role": "user", "content": f"Where is {fact.text.split()[0]} on Mondays?"}]
        text = engine.answer(question, [fact], user_id="budget", mode="text", max_tokens=10)
        first = engine.answer(question, [fact], user_id="budget", mode="kv", max_tokens=10)
        engine.wait_for_background()  # a recomputed fact is recaptured...
        second = engine.answer(question, [fact], user_id="budget", mode="kv", max_tokens=10)
        assert second.metrics.recomputed_fact_ids == []  # ...and injected next time
        for kv in (first, second):
            assert kv.prompt_token_ids == text.prompt_token_ids
            assert kv.token_ids == text.token_ids
        assert engine.kv_stats.pool_tokens <= budget
    assert engine.kv_stats.recomputed >= 1  # evicted facts were computed from text

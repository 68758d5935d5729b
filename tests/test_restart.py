"""Facts outlive the engine: a new engine over the same store serves them again.

Both engines run the tiny random-weight model with ``enforce_eager``: the facts' KV paths
are under test, not the model's answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine


def tiny_engine(model: Path, store: Path) -> MemoryEngine:
    return MemoryEngine(str(model), store_path=str(store), kv_cache_gb=1, max_model_len=4096,
                        recompute_tail=0, capture_context=0, enforce_eager=True)


def test_restarted_engine_serves_stored_facts(tiny_model: Path, tmp_path: Path) -> None:
    store = tmp_path / "memory.sqlite"
    question = [{"role": "user", "content": "Where does Ravi fly on Friday?"}]
    with tiny_engine(tiny_model, store) as engine:
        facts = engine.memory.add(["Ravi's passport number ends in 771.",
                                   "Ravi flies to Nairobi on Friday."], user_id="restart")
        before = engine.chat(question, user_id="restart", k=2, max_tokens=12)

    # A new engine process over the same durable store: nothing of its KV exists yet.
    with tiny_engine(tiny_model, store) as restarted:
        assert {f.id for f in restarted.memory.list(user_id="restart")} == {f.id for f in facts}
        first = restarted.chat(question, user_id="restart", k=2, max_tokens=12)
        assert sorted(first.metrics.recomputed_fact_ids) == sorted(f.id for f in facts)
        # only the header, captured at start, exists in the new engine
        assert first.metrics.injected_tokens == len(restarted.builder.header_ids)
        assert first.metrics.fact_ids == before.metrics.fact_ids
        assert first.token_ids == restarted.chat(
            question, user_id="restart", k=2, max_tokens=12, mode="text").token_ids
        restarted.wait_for_background()  # recomputed facts are recaptured lazily
        second = restarted.chat(question, user_id="restart", k=2, max_tokens=12)
        assert second.metrics.recomputed_fact_ids == []
        assert second.metrics.injected_tokens > 0

"""Facts outlive the engine: a new engine over the same store serves them again.

The new engine runs the tiny random-weight model with ``enforce_eager`` (it starts without
torch.compile): what it must show is the store's facts served with none of their KV, which
does not depend on the model; the facts are added through the shared engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine


def test_restarted_engine_serves_stored_facts(engine: MemoryEngine, engine_store_path: Path,
                                              tiny_model: Path) -> None:
    facts = engine.memory.add(["Ravi's passport number ends in 771.",
                               "Ravi flies to Nairobi on Friday."], user_id="restart")
    question = [{"role": "user", "content": "Where does Ravi fly on Friday?"}]
    before = engine.chat(question, user_id="restart", k=2, max_tokens=12)

    # A new engine process over the same durable store: nothing of its KV exists yet.
    with MemoryEngine(str(tiny_model), store_path=str(engine_store_path), kv_cache_gb=1,
                      max_model_len=4096, recompute_tail=0, capture_context=0,
                      enforce_eager=True) as restarted:
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

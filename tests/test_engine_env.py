"""Two engines in one process, each with its own KV cache size.

vLLM's CPU engine takes its KV cache size from ``VLLM_CPU_KVCACHE_SPACE``; each engine
sets it from its ``kv_cache_gb`` for its own start and puts back what was there, so a
second engine is not given the first one's (nor the process the last one's).

The first engine is the session's ``tool_engine`` (the tiny model, ``kv_cache_gb=1``),
which earlier tests have started: engines of one process start one at a time, so a
second start of its own would add a whole start to this test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine

KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"


def test_a_second_engine_gets_its_own_kv_cache_size(tool_engine: MemoryEngine,
                                                    tiny_model: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale_memory.bench.synthetic import dummy_runtime

    first = tool_engine.runtime
    assert first.config.kv_cache_gb == 1
    monkeypatch.delenv(KV_SPACE, raising=False)
    second = dummy_runtime(tiny_model, kv_cache_gb=2, enforce_eager=True,
                           max_model_len=first.config.max_model_len)
    try:
        assert KV_SPACE not in os.environ  # the start's own setting is gone
        assert first.kv_cache_blocks > 0
        assert second.kv_cache_blocks == 2 * first.kv_cache_blocks
        for runtime in (first, second):  # both serve
            done = runtime.run(runtime.complete([5, 6, 7, 8], max_tokens=2))
            assert len(done.token_ids) == 2
    finally:
        second.close()

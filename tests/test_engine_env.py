"""Two engines in one process, each with its own KV cache size.

vLLM's CPU engine takes its KV cache size from ``VLLM_CPU_KVCACHE_SPACE``; each engine
sets it from its ``kv_cache_gb`` for its own start and puts back what was there, so a
second engine is not given the first one's (nor the process the last one's).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"


def test_a_second_engine_gets_its_own_kv_cache_size(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale_memory.bench.synthetic import dummy_runtime, write_dummy_model

    monkeypatch.delenv(KV_SPACE, raising=False)
    folder = write_dummy_model(tmp_path / "model", "llama-tiny")
    options = dict(max_model_len=1024, enforce_eager=True)
    first = dummy_runtime(folder, kv_cache_gb=1, **options)
    try:
        assert KV_SPACE not in os.environ  # the start's own setting is gone
        second = dummy_runtime(folder, kv_cache_gb=2, **options)
        try:
            assert KV_SPACE not in os.environ
            assert first.kv_cache_blocks > 0
            assert second.kv_cache_blocks == 2 * first.kv_cache_blocks
            for runtime in (first, second):  # both serve
                done = runtime.run(runtime.complete([5, 6, 7, 8], max_tokens=2))
                assert len(done.token_ids) == 2
        finally:
            second.close()
    finally:
        first.close()

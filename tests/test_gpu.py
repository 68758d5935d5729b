"""Exactness on CUDA vLLM (skipped without a GPU): dummy weights, token-id prompts."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

# Not torch.cuda.is_available(): touching CUDA here would break vLLM's forked engine.
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs CUDA")]


def test_fact_injected_where_captured_matches_vllms_prefix_cache(tmp_path: Path) -> None:
    from inferscale_memory.bench.synthetic import (
        SyntheticWorkload,
        dummy_runtime,
        write_dummy_model,
    )

    runtime = dummy_runtime(write_dummy_model(tmp_path / "model", "llama-tiny"),
                            gpu_memory_utilization=0.3, max_model_len=2048)
    try:
        block = runtime.block_size
        work = SyntheticWorkload(runtime, vocab=32000, header_len=block, fact_len=block,
                                 question_len=block - 4)  # stays in the last block

        async def scenario() -> tuple[object, ...]:
            await work.capture(2)
            prompt = work.prompt([0])
            await runtime.reset_prefix_cache()
            fresh = await work.run(prompt, "text", max_tokens=32, logprobs=5)
            warm = await work.run(prompt, "text", max_tokens=32, logprobs=5)
            kv = await work.run(prompt, "kv", max_tokens=32, logprobs=5)
            moved = await work.run(work.prompt([1, 0]), "kv", max_tokens=4)
            return fresh, warm, kv, moved

        fresh, warm, kv, moved = runtime.run(asyncio.wait_for(scenario(), 300))
        assert warm.num_cached_tokens == 2 * block
        assert kv.report["injected_tokens"] == 2 * block
        assert kv.token_ids == warm.token_ids
        assert kv.logprobs[0] == warm.logprobs[0]
        # header from the tenant's prefix cache, facts 1 and 0 (rotated to a new place) loaded
        assert moved.num_cached_tokens == 3 * block
        assert moved.report["injected_tokens"] == 2 * block
        print("fresh prefill equals warm prefix:", fresh.logprobs == warm.logprobs)
    finally:
        runtime.close()

"""The injection-exactness scenario shared by the GPU and tensor-parallel tests."""

from __future__ import annotations

from typing import Any

from inferscale_memory.bench.synthetic import SyntheticWorkload
from inferscale_memory.runtime import VllmRuntime


def block_workload(runtime: VllmRuntime) -> SyntheticWorkload:
    """Header and facts of one block each, so the text path finds them in vLLM's prefix
    cache, and a question that stays in the last block."""
    block = runtime.block_size
    return SyntheticWorkload(runtime, vocab=32000, header_len=block, fact_len=block,
                             question_len=block - 4)


async def inject_vs_prefix_cache(work: SyntheticWorkload, max_tokens: int) -> tuple[Any, ...]:
    """Capture two facts; answer header + fact 0 by a fresh prefill, from vLLM's prefix
    cache and with the fact injected (``max_tokens`` tokens, top-5 logprobs); then answer
    facts 1 and 0 (0 moved to a new position) injected. Returns (fresh, warm, kv, moved)."""
    await work.capture(2)
    prompt = work.prompt([0])
    await work.runtime.reset_prefix_cache()
    fresh = await work.run(prompt, "text", max_tokens=max_tokens, logprobs=5)
    warm = await work.run(prompt, "text", max_tokens=max_tokens, logprobs=5)
    kv = await work.run(prompt, "kv", max_tokens=max_tokens, logprobs=5)
    moved = await work.run(work.prompt([1, 0]), "kv", max_tokens=4)
    return fresh, warm, kv, moved

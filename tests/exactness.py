"""The injection-exactness scenario shared by the GPU and tensor-parallel tests."""

from __future__ import annotations

import asyncio
from typing import Any

from inferscale_memory.bench.synthetic import USER, SyntheticWorkload
from inferscale_memory.runtime import VllmRuntime


def block_workload(runtime: VllmRuntime) -> SyntheticWorkload:
    """Header and facts of one block each, so the text path finds them in vLLM's prefix
    cache, and a question that stays in the last block."""
    block = runtime.block_size
    return SyntheticWorkload(runtime, vocab=32000, header_len=block, fact_len=block,
                             question_len=block - 4)


async def inject_vs_prefix_cache(work: SyntheticWorkload, max_tokens: int) -> tuple[Any, ...]:
    """Capture two facts, one after the other; answer header + fact 0 by a fresh prefill,
    from vLLM's prefix cache and with the fact injected (``max_tokens`` tokens, top-5
    logprobs); then answer facts 1 and 0 (0 moved to a new position) injected. Returns
    (fresh, warm, kv, moved).

    What is bit-exact, on any CPU and on CUDA: the prefix cache that ``warm`` reads was
    filled by a prefill of exactly header + fact 0, alone in its step: the computation
    that captured them. ``warm`` and ``kv`` then compute the same question over the same
    bits. ``fresh`` computed header + fact 0 together with the question, a GEMM of other
    shapes; whether it matches depends on the CPU's kernels (on an AMD EPYC, vLLM falls
    back from oneDNN to torch's linear and the last bits differ), so it is only recorded.
    """
    # One capture at a time: two concurrent ones share a step or not depending on timing
    # (on a loaded machine), and vLLM's CPU kernels are not batch invariant.
    await work.capture(1)
    await work.capture(1)
    prompt = work.prompt([0])
    await work.runtime.reset_prefix_cache()
    fresh = await work.run(prompt, "text", max_tokens=max_tokens, logprobs=5)
    await work.runtime.reset_prefix_cache()
    await work.runtime.complete(work.header + work.facts[0], max_tokens=1,
                                user=USER)  # the text path's salt; as captured
    warm = await work.run(prompt, "text", max_tokens=max_tokens, logprobs=5)
    kv = await work.run(prompt, "kv", max_tokens=max_tokens, logprobs=5)
    moved = await work.run(work.prompt([1, 0]), "kv", max_tokens=4)
    return fresh, warm, kv, moved


def check_injection_exact(runtime: VllmRuntime, max_tokens: int,
                          timeout: float = 300) -> bool:
    """Run :func:`inject_vs_prefix_cache` and assert what it shows: the injected fact
    answers as vLLM's prefix cache does (tokens and top-5 logprobs), header and fact
    injected, nothing recomputed, and the moved fact loaded too. Returns whether the
    fresh prefill also matched (recorded only, see :func:`inject_vs_prefix_cache`)."""
    block = runtime.block_size
    fresh, warm, kv, moved = runtime.run(asyncio.wait_for(
        inject_vs_prefix_cache(block_workload(runtime), max_tokens=max_tokens), timeout))
    assert warm.num_cached_tokens == 2 * block
    assert kv.report.injected_tokens == 2 * block  # header + fact
    assert kv.report.missing == ()
    assert len(set(warm.logprobs[0].values())) > 1  # the logits say something
    assert kv.token_ids == warm.token_ids
    assert kv.logprobs == warm.logprobs
    # header from the user's prefix cache; fact 1, then fact 0 rotated to a new place
    assert moved.num_cached_tokens == 3 * block
    assert moved.report.injected_tokens == 2 * block
    assert moved.report.missing == ()
    return bool(fresh.logprobs == warm.logprobs)

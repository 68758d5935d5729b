"""Exactness on CUDA vLLM (skipped without a GPU): dummy weights, token-id prompts."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Not torch.cuda.is_available(): touching CUDA here would break vLLM's forked engine.
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs CUDA")]


def _gpus() -> int:
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("tp", [1, 2])
def test_fact_injected_where_captured_matches_vllms_prefix_cache(tmp_path: Path, tp: int,
                                                                   cache_dtype: str) -> None:
    """With tensor parallelism each rank captures and injects its own KV heads; in an fp8
    cache (FlashAttention 3's e4m3 bytes) a fact is copied byte for byte."""

    from inferscale_memory.bench.synthetic import dummy_runtime, write_random_model

    if _gpus() < tp:
        pytest.skip(f"needs {tp} GPUs")
    # Random weights of usable scale: vLLM's dummy weights give uniform logits, with which
    # any KV would "match" (see write_random_model).
    runtime = dummy_runtime(write_random_model(tmp_path / "model", "llama-tiny"),
                            engine_args={"load_format": "safetensors",
                                         "kv_cache_dtype": cache_dtype},
                            gpu_memory_utilization=0.3, max_model_len=2048,
                            tensor_parallel_size=tp)
    try:
        check_exactness(runtime)
    finally:
        runtime.close()


def check_exactness(runtime: object) -> None:
    """``tests/exactness.py``'s scenario, 32 tokens."""
    from exactness import check_injection_exact

    print("fresh prefill equals warm prefix:", check_injection_exact(runtime, max_tokens=32))


# A real model's folder (the staged Qwen2.5-Coder of ../shared/gpu/README.md).
REAL_MODEL_ENV = "INFERSCALE_GPU_MODEL"


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_a_real_models_injected_fact_answers_as_its_prefix_cache(cache_dtype: str) -> None:
    """The same scenario on a real model's weights (token ids, greedy, 32 tokens)."""
    import os

    from inferscale_memory.bench.synthetic import dummy_runtime

    folder = os.environ.get(REAL_MODEL_ENV)
    if not folder:
        pytest.skip(f"set {REAL_MODEL_ENV} to a model folder")
    runtime = dummy_runtime(Path(folder), engine_args={"load_format": "auto",
                                                       "kv_cache_dtype": cache_dtype},
                            gpu_memory_utilization=0.3, max_model_len=2048)
    try:
        check_exactness(runtime)
    finally:
        runtime.close()



def test_a_fact_demoted_to_host_memory_is_promoted_and_injected_exactly(
        tmp_path: Path) -> None:
    """The host tier on CUDA: pinned rows, copies back before the fused load."""
    from exactness import block_workload

    from inferscale_memory.bench.synthetic import USER, dummy_runtime, write_random_model
    from inferscale_memory.connector.params import FactKey

    block, token_bytes = 16, 4 * 2 * 4 * 128 * 2  # llama-tiny: layers x K,V x heads x dim
    runtime = dummy_runtime(write_random_model(tmp_path / "model", "llama-tiny"),
                            engine_args={"load_format": "safetensors"},
                            gpu_memory_utilization=0.3, max_model_len=2048,
                            kv_pool_gb=3 * block * token_bytes / 2**30,  # header + 2 facts
                            kv_host_pool_gb=16 * block * token_bytes / 2**30)
    try:
        assert runtime.block_size == block
        work = block_workload(runtime)

        async def scenario() -> tuple[object, ...]:
            for _ in range(6):  # one at a time: facts 0-3 end up on the host
                await work.capture(1)
            prompt = work.prompt([0])
            await runtime.reset_prefix_cache()
            await work.run(prompt, "text", max_tokens=32, logprobs=5)
            warm = await work.run(prompt, "text", max_tokens=32, logprobs=5)
            kv = await work.run(prompt, "kv", max_tokens=32, logprobs=5)
            return warm, kv

        warm, kv = runtime.run(asyncio.wait_for(scenario(), 300))
        assert kv.report.promoted == (FactKey(USER, "0"),)
        assert kv.report.demoted == (FactKey(USER, "4"),)  # the device's least recent fact
        assert kv.report.injected_tokens == 2 * block and kv.report.missing == ()
        assert len(set(warm.logprobs[0].values())) > 1
        assert kv.token_ids == warm.token_ids
        assert kv.logprobs == warm.logprobs
    finally:
        runtime.close()

FUSED_CHECK = """
import sys, torch
sys.path.insert(0, "tests/kv")
from test_cache_map import BS, NB, flash_like
from inferscale_memory.kv import fused
from inferscale_memory.kv.cache_map import flat_view, probe_cache_map
from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.slab import KVSlab

L, H, D, n = 4, 2, 8, 40
dev, dtype = torch.device("cuda"), torch.bfloat16
g = torch.Generator().manual_seed(0)
slab = KVSlab(L, H, D, dtype, dev, capacity=64)
slab.data.copy_(torch.randn(slab.data.shape, generator=g).to(dtype))
rows = torch.randperm(64, generator=g)[:n].to(dev)
slots = torch.randperm(NB * BS, generator=g)[:n].to(dev)
deltas = torch.randint(-40, 4000, (n,), generator=g)
deltas[::3] = 0
inv = 1.0 / (500000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
rope = RotaryShift(inv, D, True)

def caches():
    out = []
    for _ in range(L):
        cache, _ = flash_like(dtype)
        cache = cache.to(dev)
        def write(k, v, s, cache=cache):
            cache[0].view(-1, H, D)[s] = k
            cache[1].view(-1, H, D)[s] = v
        out.append((cache, write))
    return out

portable, fusedc = caches(), caches()
layout = probe_cache_map(portable[0][0], portable[0][1], BS, H, D)
assert fused.available(dev, dtype, dtype, [layout])
keys, values = slab.gather(rows)
keys = rope.apply(keys, rope.prepare(deltas, dev))
for i, (_, write) in enumerate(portable):
    write(keys[i], values[i], slots)
fused.FusedInjector([flat_view(c) for c, _ in fusedc], layout, H, D, D, True)(
    slab.data, rows, slots, rope.prepare(deltas, dev))
unmoved = slots[deltas.to(dev) == 0]
for (want, _), (got, _) in zip(portable, fusedc):
    assert torch.equal(got.view(2, -1, H, D)[:, unmoved], want.view(2, -1, H, D)[:, unmoved])
    assert torch.equal(got[1], want[1])
    ulps = (got[0].view(torch.int16).int() - want[0].view(torch.int16).int()).abs().max()
    assert int(ulps) <= 1, int(ulps)
print("FUSED OK, max ulp difference of rotated keys:", int(ulps))
"""


def test_fused_kernel_matches_the_portable_path_on_cuda() -> None:
    """bf16 on CUDA: values and unmoved keys bit-identical, rotated keys within 1 ulp
    (the kernel may contract multiply-adds; the interpreter test checks the rest)."""
    done = subprocess.run([sys.executable, "-c", FUSED_CHECK], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)


FUSED_FP8_CHECK = """
import sys, torch
from types import SimpleNamespace
sys.path.insert(0, "tests/kv")
from test_fp8 import A, B, DIM, HEADS, LAYERS, random_bytes, scales_of, shift
from inferscale_memory.connector.plan import LoadOp, StepPlan
from inferscale_memory.connector.worker import WorkerSide
from inferscale_memory.kv import fused
from inferscale_memory.kv.cache_map import CacheMap
from inferscale_memory.kv.paged import PagedCaches, PagedLayer
from inferscale_memory.kv.pool import PoolEntry
from inferscale_memory.kv.quant import Fp8Cache
from inferscale_memory.kv.slab import KVSlab
from inferscale_memory.kv.tiers import FactTiers

dev, BS, NB = torch.device("cuda"), 16, 16
# FlashAttention's layout, [2, blocks, block_size, heads, head_dim] bytes
offsets = torch.arange(2 * NB * BS * HEADS * DIM).view(2, NB, BS, HEADS, DIM)[:, 0]
cache_map = CacheMap(BS, BS * HEADS * DIM, offsets.to(dev))

def side(fmt, scales, use_fused):
    s = WorkerSide(SimpleNamespace(cache_config=SimpleNamespace(block_size=BS)))
    k, v = scales_of(scales)
    rows = torch.stack([torch.stack((k * (i + 1), v * (i + 1))) for i in range(LAYERS)])
    caches = [torch.zeros(2, NB, BS, HEADS, DIM, dtype=torch.uint8, device=dev)
              for _ in range(LAYERS)]
    modules = [SimpleNamespace(_k_scale_float=float(r[0, 0]), _v_scale_float=float(r[1, 0]))
               for r in rows]
    layers = [PagedLayer(f"l{i}", c.view(-1), cache_map, None, m)
              for i, (c, m) in enumerate(zip(caches, modules))]
    fp8 = Fp8Cache(fmt, rows.to(dev))
    kernel = None
    if use_fused:
        assert fused.available(dev, torch.uint8, torch.uint8, [cache_map])
        kernel = fused.FusedInjector([c.view(-1) for c in caches], cache_map, HEADS, DIM,
                                     DIM, True, fp8)
    s.caches = PagedCaches(layers, shift().on(dev), fp8, kernel)
    s._fp8_scales = s._scale_floats()
    s.tiers = FactTiers(KVSlab(LAYERS, HEADS, DIM, torch.uint8, dev, capacity=64))
    for n, (key, start) in enumerate(((A, 0), (B, 7))):
        got = s.tiers.device.allocate_rows(40)
        s.tiers.device.data[torch.from_numpy(got).to(dev)] = random_bytes(
            (40, LAYERS, 2, HEADS, DIM), fmt, 20 + n).to(dev)
        s.tiers.pool.put(key, PoolEntry(got, start, 0))
    return s, caches

plan = StepPlan(loads=[LoadOp("r", list(range(NB)), [(A, 0, 40, 0), (B, 0, 40, 150)])])
for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
    for scales in ("one", "odd", "per_head"):
        (p, pc), (f, fc) = side(fmt, scales, False), side(fmt, scales, True)
        p.start_load(plan)
        f.start_load(plan)
        torch.cuda.synchronize()
        for want, got in zip(pc, fc):
            assert torch.equal(got, want), (fmt, scales)
print("FUSED FP8 OK")
"""


def test_fused_fp8_kernel_matches_the_portable_path_on_cuda() -> None:
    """fp8 on CUDA: the kernel's dequantize-rotate-requantize writes the same bytes as
    torch's (the rounding is done in float32 arithmetic, so the hardware conversion after
    it is exact)."""
    done = subprocess.run([sys.executable, "-c", FUSED_FP8_CHECK], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FUSED FP8 OK" in done.stdout


STAGE_CHECK = """
import numpy as np
import torch
from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.staging import HostStage

stage = HostStage(torch.device("cuda"), capacity=8)
assert stage.pinned
outs, wants = [], []
for n in (3, 8, 5, 20, 7):  # grows three times and reuses its buffer between
    want = np.arange(3 * n, dtype=np.int64).reshape(3, n) * n
    outs.append(stage.to_device(want))
    wants.append(want)
torch.cuda.synchronize()
for out, want in zip(outs, wants):  # each result kept its values: none aliases the buffer
    assert out.is_cuda and out.tolist() == want.tolist()
assert stage.capacity == 64 and stage.copies == 5
# a rotation built from device deltas equals the one built from host deltas
inv = 1.0 / (500000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
host = RotaryShift(inv, 8, True)
device = host.on(torch.device("cuda"))
deltas = torch.tensor([0, 5, -3, 4000])
a, b = host.prepare(deltas, torch.device("cuda")), device.rotation(deltas.cuda())
assert torch.equal(a.cos, b.cos) and torch.equal(a.sin, b.sin) and torch.equal(a.moved, b.moved)
print("STAGE OK")
"""


def test_load_indices_go_to_the_device_in_one_pinned_copy() -> None:
    """The load step's index arrays travel through page-locked memory (a pageable copy
    waits for the whole queued forward pass), and stay valid after the buffer's reuse."""
    done = subprocess.run([sys.executable, "-c", STAGE_CHECK], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "STAGE OK" in done.stdout

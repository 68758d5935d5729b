"""Learning where vLLM's attention backend puts each K/V element, without assuming it.

Cache memory layouts differ between backends and versions (the CPU backend stores keys
transposed inside ISA-dependent tiles; FlashAttention packs K and V differently). Instead
of hard-coding any of them, :func:`probe_cache_map` writes a coded pattern through the
backend's *own* cache writer into two free blocks and reads back where every element
landed. The result maps (token in block, head, dim) to a flat offset, for K and for V.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inferscale_memory.kv.quant import exact_ints

# Writes key/value rows ``[n, heads, head_dim]`` into the cache at ``slots`` ``[n]``.
CacheWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]

EXACT_INTS = 256  # integers 1..256 are exact in fp16, bf16 and fp32


@dataclass(frozen=True)
class Fp8Probe:
    """How to probe an fp8 cache: the writer takes the model's dtype and stores
    ``x / scale`` as float8, so the probe writes ``digit * scale`` and reads the digits
    back from the bytes. Digits stay within the integers the format holds exactly.

    Attributes:
        dtype: The float8 format of the cache's bytes.
        input_dtype: The dtype the writer takes (the model's).
        k_scale, v_scale: ``[heads]`` scales of the layer whose writer is probed.
    """

    dtype: torch.dtype
    input_dtype: torch.dtype
    k_scale: torch.Tensor
    v_scale: torch.Tensor

    @property
    def base(self) -> int:
        """Digits per pass (1..base are exact in ``dtype``)."""
        return exact_ints(self.dtype)


@dataclass(frozen=True)
class CacheMap:
    """Where the K and V of any slot live in the flat storage of one layer's cache.

    Attributes:
        block_size: Tokens per block.
        block_stride: Flat distance between the same element of consecutive blocks.
        offsets: ``[2, block_size, heads, head_dim]`` flat offsets (K then V) of block 0.
    """

    block_size: int
    block_stride: int
    offsets: torch.Tensor

    def indices(self, slots: torch.Tensor) -> torch.Tensor:
        """Flat indices ``[2, n, heads, head_dim]`` of the K and V of ``slots``."""
        blocks, within = slots // self.block_size, slots % self.block_size
        base = (blocks * self.block_stride)[None, :, None, None]
        return base + self.offsets[:, within]


def flat_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """A 1-D view of the cache's elements in memory order (no copy)."""
    order = sorted(range(kv_cache.dim()), key=lambda d: kv_cache.stride(d), reverse=True)
    dense = kv_cache.permute(order)
    if not dense.is_contiguous():
        raise ValueError("the KV cache is not a dense tensor; its memory layout cannot be probed")
    return dense.reshape(-1)


def probe_cache_map(kv_cache: torch.Tensor, write: CacheWriter, block_size: int,
                    num_heads: int, head_dim: int, fp8: Fp8Probe | None = None) -> CacheMap:
    """Find the cache map by writing element codes into blocks 1 and 2 of an unused cache
    (``fp8``: the cache holds float8 bytes; offsets then count bytes).

    Must run before the engine serves requests: it overwrites and then zeroes the cache.
    """
    flat = flat_view(kv_cache)
    if flat.element_size() == 1 and flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)  # float8 storage: zeroed and read as bytes
    args = (flat, kv_cache.device, write, block_size, num_heads, head_dim, fp8)
    offsets_1 = _probe_block(*args, block=1)
    offsets_2 = _probe_block(*args, block=2)
    strides = (offsets_2 - offsets_1).unique()
    if strides.numel() != 1:
        raise ValueError("KV cache blocks are not evenly strided; not supported")
    stride = int(strides.item())
    offsets = (offsets_1 - stride).view(2, block_size, num_heads, head_dim)
    return CacheMap(block_size, stride, offsets.to(kv_cache.device))


def _probe_block(flat: torch.Tensor, device: torch.device, write: CacheWriter,
                 block_size: int, num_heads: int, head_dim: int, fp8: Fp8Probe | None,
                 block: int) -> torch.Tensor:
    """Flat offsets of every K element then every V element of one block, by code."""
    num_codes = 2 * block_size * num_heads * head_dim
    codes = torch.arange(num_codes, dtype=torch.int64)
    slots = torch.arange(block * block_size, (block + 1) * block_size, device=device)
    located = torch.zeros(num_codes, dtype=torch.int64)
    where = torch.empty(0, dtype=torch.int64)
    base = fp8.base if fp8 is not None else EXACT_INTS
    scale = 1
    while scale < num_codes:
        digits = (codes // scale) % base + 1  # 1..base: exact, never 0
        k, v = _encode(digits.view(2, block_size, num_heads, head_dim), flat.dtype, fp8)
        flat.zero_()
        write(k.to(device), v.to(device), slots)
        where = torch.nonzero(flat).flatten()
        if where.numel() != num_codes:
            flat.zero_()
            raise ValueError("the cache writer did not write one element per K/V value")
        located += (_decode(flat[where].cpu(), fp8) - 1) * scale
        scale *= base
    flat.zero_()
    offsets = torch.empty(num_codes, dtype=torch.int64)
    offsets[located] = where.cpu()
    return offsets


def _encode(digits: torch.Tensor, cache_dtype: torch.dtype,
            fp8: Fp8Probe | None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V rows that the writer stores as ``digits``."""
    if fp8 is None:
        k, v = digits.to(cache_dtype)
        return k, v
    k = digits[0].to(torch.float32) * fp8.k_scale.cpu()[:, None]
    v = digits[1].to(torch.float32) * fp8.v_scale.cpu()[:, None]
    return k.to(fp8.input_dtype), v.to(fp8.input_dtype)


def _decode(stored: torch.Tensor, fp8: Fp8Probe | None) -> torch.Tensor:
    """The digits the cache holds (int64)."""
    if fp8 is None:
        return stored.to(torch.int64)
    # digit * scale / scale rounds back to the digit: the format's spacing there is >= 1
    return stored.view(fp8.dtype).to(torch.float32).round().to(torch.int64)

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

# Writes key/value rows ``[n, heads, head_dim]`` into the cache at ``slots`` ``[n]``.
CacheWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]

EXACT_INTS = 256  # integers 1..256 are exact in fp16, bf16 and fp32


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
                    num_heads: int, head_dim: int) -> CacheMap:
    """Find the cache map by writing element codes into blocks 1 and 2 of an unused cache.

    Must run before the engine serves requests: it overwrites and then zeroes the cache.
    """
    flat = flat_view(kv_cache)
    offsets_1 = _probe_block(flat, kv_cache, write, 1, block_size, num_heads, head_dim)
    offsets_2 = _probe_block(flat, kv_cache, write, 2, block_size, num_heads, head_dim)
    strides = (offsets_2 - offsets_1).unique()
    if strides.numel() != 1:
        raise ValueError("KV cache blocks are not evenly strided; not supported")
    stride = int(strides.item())
    offsets = (offsets_1 - stride).view(2, block_size, num_heads, head_dim)
    return CacheMap(block_size, stride, offsets.to(kv_cache.device))


def _probe_block(flat: torch.Tensor, kv_cache: torch.Tensor, write: CacheWriter, block: int,
                 block_size: int, num_heads: int, head_dim: int) -> torch.Tensor:
    """Flat offsets of every K element then every V element of one block, by code."""
    num_codes = 2 * block_size * num_heads * head_dim
    codes = torch.arange(num_codes, dtype=torch.int64)
    slots = torch.arange(block * block_size, (block + 1) * block_size, device=kv_cache.device)
    located = torch.zeros(num_codes, dtype=torch.int64)
    where = torch.empty(0, dtype=torch.int64)
    scale = 1
    while scale < num_codes:
        digits = (codes // scale) % EXACT_INTS + 1  # 1..256: exact, never 0
        k, v = digits.view(2, block_size, num_heads, head_dim).to(kv_cache.dtype)
        flat.zero_()
        write(k.to(kv_cache.device), v.to(kv_cache.device), slots)
        where = torch.nonzero(flat).flatten()
        if where.numel() != num_codes:
            flat.zero_()
            raise ValueError("the cache writer did not write one element per K/V value")
        located += (flat[where].to(torch.int64).cpu() - 1) * scale
        scale *= EXACT_INTS
    flat.zero_()
    offsets = torch.empty(num_codes, dtype=torch.int64)
    offsets[located] = where.cpu()
    return offsets

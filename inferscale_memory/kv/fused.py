"""One Triton kernel that injects a whole step's facts into the paged cache (CUDA).

The portable path (:meth:`~inferscale_memory.connector.worker.WorkerSide.start_load`)
gathers the rows from the slab, rotates the keys and calls the attention backend's cache
writer once per layer: a few kernels and temporary tensors per layer. On CUDA this kernel
does it all at once: each program takes one token of one layer, reads its K and V from
the slab, rotates K by the token's position delta (its cos/sin looked up in the angle table of
:class:`~inferscale_memory.kv.rope.RotaryShift`, as the portable path does, so both paths
use the same angles and no kernel computes them per step) and
stores both into the layer's cache at the flat offsets the cache-map probe learned. Tokens
whose delta is 0 are copied bit for bit. In an fp8 cache the slab and the caches hold
bytes: a moved key is dequantized with its layer's K scale, rotated and quantized again
(saturated to the format's range, rounded to nearest even), as
:class:`~inferscale_memory.kv.quant.Fp8Cache` does on the portable path.

Runs under ``TRITON_INTERPRET=1`` on CPU tensors too, which is how it is tested without a
GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from inferscale_memory.kv.cache_map import CacheMap
from inferscale_memory.kv.quant import Fp8Cache
from inferscale_memory.kv.rope import Rotation

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton: the portable path serves
    triton = None


# "0" turns the kernel off (to compare with the portable path).
FUSED_ENV = "INFERSCALE_FUSED_INJECT"


def available(device: torch.device, cache_dtype: torch.dtype, slab_dtype: torch.dtype,
              cache_maps: Sequence[CacheMap]) -> bool:
    """Whether the kernel can serve these caches (CUDA, one dtype, one cache map, and not
    turned off by ``INFERSCALE_FUSED_INJECT=0``)."""
    return (triton is not None and device.type == "cuda" and cache_dtype == slab_dtype
            and len({id(cache_map) for cache_map in cache_maps}) == 1
            and os.environ.get(FUSED_ENV, "1") != "0")


if triton is not None:

    @triton.jit
    def _round_to_float8(x, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
        """``x`` (float32, within the format's range) rounded to nearest even on the
        float8 grid, in float32 arithmetic, so that the conversion after it is exact:
        the same bits on a GPU and in Triton's interpreter, whose own float8 conversion
        drops the carry of a rounding (1.97 -> 1.0)."""
        exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        exponent = tl.maximum(exponent, MIN_EXP) - MANTISSA  # subnormals: a fixed step
        step = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
        y = x / step  # exact: a power of two
        r = tl.floor(y + 0.5)
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        r = tl.where((r - y == 0.5) & odd, r - 1.0, r)  # a tie goes to the even neighbour
        return r * step

    @triton.jit
    def _inject_kernel(slab_ptr, rows_ptr, slots_ptr, cos_ptr, sin_ptr, deltas_ptr,
                       cache_addrs_ptr, offsets_ptr, scales_ptr, block_size, block_stride,
                       row_stride, layer_stride, kv_stride,
                       HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       HEADS_P2: tl.constexpr, DIM_P2: tl.constexpr,
                       ROT_HALF: tl.constexpr, NEOX: tl.constexpr, ROTATE: tl.constexpr,
                       FP8: tl.constexpr, E4M3: tl.constexpr, FP8_MAX: tl.constexpr):
        tok = tl.program_id(0)
        layer = tl.program_id(1)
        row = tl.load(rows_ptr + tok)
        slot = tl.load(slots_ptr + tok)
        block = slot // block_size
        within = slot % block_size
        elem_ty = slab_ptr.dtype.element_ty
        cache = tl.load(cache_addrs_ptr + layer).to(tl.pointer_type(elem_ty))

        h = tl.arange(0, HEADS_P2)[:, None]
        d = tl.arange(0, DIM_P2)[None, :]
        mask = (h < HEADS) & (d < HEAD_DIM)
        src = slab_ptr + row * row_stride + layer * layer_stride + h * HEAD_DIM
        k = tl.load(src + d, mask=mask)
        v = tl.load(src + kv_stride + d, mask=mask)

        if ROTATE:
            if NEOX:  # pairs (i, i + half)
                lower = d < ROT_HALF
                partner = tl.where(lower, d + ROT_HALF, d - ROT_HALF)
                freq = tl.where(lower, d, d - ROT_HALF)
            else:  # pairs (2i, 2i + 1)
                lower = (d % 2) == 0
                partner = tl.where(lower, d + 1, d - 1)
                freq = d // 2
            rotary = d < 2 * ROT_HALF
            rmask = mask & rotary
            xp = tl.load(src + partner, mask=rmask, other=0)
            if FP8:  # bytes -> float8 -> float32, times the layer's K scale per head
                scale = tl.load(scales_ptr + layer * 2 * HEADS + h, mask=h < HEADS, other=1.0)
                if E4M3:
                    x = k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
                    xp = xp.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
                else:
                    x = k.to(tl.float8e5, bitcast=True).to(tl.float32) * scale
                    xp = xp.to(tl.float8e5, bitcast=True).to(tl.float32) * scale
            else:
                x = k.to(tl.float32)
                xp = xp.to(tl.float32)
            delta = tl.load(deltas_ptr + tok)
            reach = tl.abs(delta)  # the table holds deltas >= 0: sin(-a) = -sin(a)
            cos = tl.load(cos_ptr + reach * ROT_HALF + freq, mask=rotary, other=1.0)
            sin = tl.load(sin_ptr + reach * ROT_HALF + freq, mask=rotary, other=0.0)
            sin = tl.where(delta < 0, -sin, sin)
            # y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin (as RotaryShift.apply)
            rotated = tl.where(lower, x * cos - xp * sin, x * cos + xp * sin)
            if FP8:  # quantized again: divided by the scale, saturated, nearest even
                rotated = tl.minimum(tl.maximum(rotated / scale, -FP8_MAX), FP8_MAX)
                if E4M3:
                    rotated = _round_to_float8(rotated, 3, -6)
                    stored = rotated.to(tl.float8e4nv).to(elem_ty, bitcast=True)
                else:
                    rotated = _round_to_float8(rotated, 2, -14)
                    stored = rotated.to(tl.float8e5).to(elem_ty, bitcast=True)
            else:
                stored = rotated.to(elem_ty)
            k = tl.where(rotary & (delta != 0), stored, k)

        base = cache + block * block_stride
        head_off = (within * HEADS + h) * HEAD_DIM + d
        k_off = tl.load(offsets_ptr + head_off, mask=mask)
        v_off = tl.load(offsets_ptr + block_size * HEADS * HEAD_DIM + head_off, mask=mask)
        tl.store(base + k_off, k, mask=mask)
        tl.store(base + v_off, v, mask=mask)


class FusedInjector:
    """The kernel bound to one worker's caches, slab and rotary parameters."""

    def __init__(self, caches: Sequence[torch.Tensor], cache_map: CacheMap, heads: int,
                 head_dim: int, rotary_dim: int, is_neox_style: bool,
                 fp8: Fp8Cache | None = None) -> None:
        device = caches[0].device
        self._addrs = torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64,
                                   device=device)
        self._keep = list(caches)  # the addresses are only valid while the caches live
        self._cache_map = cache_map
        self._offsets = cache_map.offsets.to(device=device, dtype=torch.int64).contiguous()
        self._heads, self._head_dim = heads, head_dim
        self._rot_half, self._neox = rotary_dim // 2, is_neox_style
        self.fp8 = fp8  # the caches hold float8 bytes with these scales

    def __call__(self, slab: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                 rotation: Rotation | None) -> None:
        """Write slab ``rows`` into cache ``slots`` of every layer (keys rotated)."""
        n, layers = int(rows.shape[0]), len(self._keep)
        if n == 0:
            return
        if rotation is None:
            cos = sin = deltas = rows  # unused: ROTATE is off
        else:
            cos, sin, deltas = rotation.table.cos, rotation.table.sin, rotation.deltas
        fp8 = self.fp8
        _inject_kernel[(n, layers)](
            slab, rows, slots, cos, sin, deltas, self._addrs, self._offsets,
            fp8.scales if fp8 is not None else rows,
            self._cache_map.block_size, self._cache_map.block_stride,
            slab.stride(0), slab.stride(1), slab.stride(2),
            HEADS=self._heads, HEAD_DIM=self._head_dim,
            HEADS_P2=triton.next_power_of_2(self._heads),
            DIM_P2=triton.next_power_of_2(self._head_dim),
            ROT_HALF=self._rot_half, NEOX=self._neox, ROTATE=rotation is not None,
            FP8=fp8 is not None, E4M3=fp8 is not None and fp8.dtype == torch.float8_e4m3fn,
            FP8_MAX=fp8.max_value if fp8 is not None else 0.0)

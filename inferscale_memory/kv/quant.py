"""fp8 KV caches: what their bytes mean, and how a moved key is quantized again.

vLLM's ``kv_cache_dtype="fp8"`` stores each K and V element as one byte, ``x / scale``
rounded to a float8 format, with one scale per layer for K and one for V (or one per KV
head). The pool keeps a fact's bytes exactly as the cache held them, so a fact costs half
the bytes of a bf16 one, and a fact injected where it was captured is copied bit for bit.
A fact injected at another position has its keys dequantized with the layer's K scale,
rotated (:mod:`inferscale_memory.kv.rope`) and quantized again with the same scale, as
vLLM's own cache writer quantizes (divide, saturate to the format's finite range, round
to nearest even); values never move.

The scales are read once, when the worker registers the caches: vLLM fixes them when it
loads the weights (from the checkpoint, else 1.0). A scale that changes later (a weight
reload) makes the stored bytes mean something else; the worker then forgets every fact
(:meth:`~inferscale_memory.connector.worker.WorkerSide.start_load`), so loads fail and
vLLM computes those facts again, instead of injecting wrong KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# vLLM's fp8 cache dtypes on CUDA and CPU, by the float8 format their bytes hold. "fp8"
# is e4m3 (FlashAttention and the CPU backend store e4m3fn: finite, max 448).
FP8_FORMATS: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class Fp8Cache:
    """The float8 format of a cache's bytes and each layer's K and V scales.

    Attributes:
        dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        scales: ``[layers, 2, heads]`` float32 (K then V; a per-layer scale is repeated
            over the heads), on the device of the caches.
    """

    dtype: torch.dtype
    scales: torch.Tensor

    @property
    def max_value(self) -> float:
        return float(torch.finfo(self.dtype).max)

    def dequantize(self, raw: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """float32 values of cache bytes ``raw`` (``[..., heads, head_dim]``, any 1-byte
        dtype) under ``scale`` (``[heads]``)."""
        return raw.view(self.dtype).to(torch.float32) * scale[:, None]

    def quantize(self, values: torch.Tensor, scale: torch.Tensor,
                 like: torch.Tensor) -> torch.Tensor:
        """Cache bytes (``like``'s dtype) of float32 ``values`` under ``scale``: as vLLM's
        writer, ``values / scale`` saturated to the finite range, rounded to nearest."""
        limit = self.max_value
        scaled = (values / scale[:, None]).clamp(-limit, limit)
        return scaled.to(self.dtype).view(like.dtype)


def exact_ints(dtype: torch.dtype) -> int:
    """How many integers from 1 up are exact in a float8 format (16 for e4m3, 8 for e5m2):
    the digits of the cache-map probe."""
    mantissa = 3 if dtype == torch.float8_e4m3fn else 2
    return 2 ** (mantissa + 1)


def fp8_format(cache_dtype: object) -> torch.dtype | None:
    """The float8 format of a vLLM ``kv_cache_dtype`` name, ``None`` for an unquantized
    cache (``"auto"``, a torch dtype name)."""
    return FP8_FORMATS.get(str(cache_dtype or "auto"))


def layer_scales(k_scale: torch.Tensor | float, v_scale: torch.Tensor | float,
                 heads: int) -> torch.Tensor:
    """``[2, heads]`` float32 on the CPU from one layer's K and V scales (scalars, or one
    per KV head).

    Raises:
        ValueError: A scale has neither 1 nor ``heads`` elements.
    """
    rows = []
    for name, scale in (("K", k_scale), ("V", v_scale)):
        tensor = torch.as_tensor(scale, dtype=torch.float32).detach().cpu().flatten()
        if tensor.numel() not in (1, heads):
            raise ValueError(f"the fp8 cache's {name} scale has {tensor.numel()} elements; "
                             f"expected 1 or one per KV head ({heads})")
        rows.append(tensor.expand(heads))
    return torch.stack(rows)

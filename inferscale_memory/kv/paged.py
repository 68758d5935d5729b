"""vLLM's paged KV caches as the connector writes and reads them.

One :class:`PagedLayer` per attention layer: a flat view of its cache (bytes for an fp8
cache), the cache map the probe learned (:mod:`.cache_map`) and the backend's own writer.
:class:`PagedCaches` writes a step's loads into every layer (the fused kernel on CUDA,
else the backend's writer a layer at a time, or the probed offsets for fp8 bytes) and
gathers captured slots out of one layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inferscale_memory.kv.cache_map import CacheMap
from inferscale_memory.kv.fused import FusedInjector
from inferscale_memory.kv.quant import Fp8Cache
from inferscale_memory.kv.rope import RotaryShift, Rotation
from inferscale_memory.kv.slab import KVSlab


@dataclass
class PagedLayer:
    """One attention layer's cache."""

    name: str
    flat: torch.Tensor  # 1-D view of this layer's cache (bytes for an fp8 cache)
    cache_map: CacheMap
    write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None  # the backend's
    module: Any = None  # the attention layer (its fp8 scales)


class PagedCaches:
    """Every layer's cache, the model's rotary shift, and how loads are written.

    Attributes:
        fp8: The caches hold float8 bytes with these scales (``None``: the model's dtype).
        fused: The fused Triton kernel bound to these caches (CUDA), or ``None``.
    """

    def __init__(self, layers: list[PagedLayer], shift: RotaryShift,
                 fp8: Fp8Cache | None = None, fused: FusedInjector | None = None) -> None:
        self.layers = layers
        self.index = {layer.name: i for i, layer in enumerate(layers)}
        self.shift = shift
        self.fused = fused
        self.fp8 = fp8

    @property
    def fp8(self) -> Fp8Cache | None:
        return self._fp8

    @fp8.setter
    def fp8(self, fp8: Fp8Cache | None) -> None:  # new scales reach the kernel too
        self._fp8 = fp8
        if self.fused is not None:
            self.fused.fp8 = fp8

    def write(self, slab: KVSlab, rows: torch.Tensor, slots: torch.Tensor,
              rotation: Rotation | None) -> None:
        """Write slab ``rows`` into cache ``slots`` of every layer, keys rotated."""
        if self.fused is not None:
            self.fused(slab.data, rows, slots, rotation)
            return
        for i, layer in enumerate(self.layers):  # a layer at a time: bounded memory
            keys, values = slab.gather_layer(rows, i)  # [n, heads, head_dim]
            if self._fp8 is None:
                assert layer.write is not None
                layer.write(self.shift.apply_(keys, rotation), values, slots)
            else:
                self._write_fp8(layer, i, keys, values, slots, rotation)

    def _write_fp8(self, layer: PagedLayer, index: int, keys: torch.Tensor,
                   values: torch.Tensor, slots: torch.Tensor, rotation: Rotation | None) -> None:
        """Store a layer's fact bytes into its fp8 cache: moved keys dequantized, rotated
        and quantized again with the layer's K scale; everything else bit for bit. The
        bytes go straight to the offsets the probe learned (the backend's writer would
        quantize them a second time)."""
        fp8 = self._fp8
        assert fp8 is not None
        if rotation is not None:
            scale = fp8.scales[index, 0]
            rotated = self.shift.apply_(fp8.dequantize(keys, scale), rotation)
            keys = torch.where(rotation.moved[:, None, None],
                               fp8.quantize(rotated, scale, keys), keys)
        where = layer.cache_map.indices(slots)
        layer.flat[where[0]] = keys
        layer.flat[where[1]] = values

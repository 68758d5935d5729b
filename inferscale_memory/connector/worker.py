"""Worker side of the connector: capture fact KV into the pool, inject it into blocks.

Runs inside each vLLM worker process, next to the paged KV cache. Reads go through the
layout learned by :func:`~inferscale_memory.kv.layout.probe_layout`; writes go through
the attention backend's own cache writer, so no layout is assumed anywhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from inferscale_memory.connector import compat
from inferscale_memory.connector.params import FactKey
from inferscale_memory.connector.plan import LoadOp, StepPlan
from inferscale_memory.kv.layout import CacheLayout, flat_view, probe_layout
from inferscale_memory.kv.pool import KVPool, PoolEntry
from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.slab import KVSlab

logger = logging.getLogger(__name__)


@dataclass
class _Layer:
    name: str
    flat: torch.Tensor  # 1-D view of this layer's cache
    layout: CacheLayout
    write: Any  # compat.cache_writer


class WorkerSide:
    """Owns the KV pool of one worker (one tensor-parallel rank)."""

    def __init__(self, vllm_config: Any) -> None:
        self._config = vllm_config
        self.pool: KVPool[FactKey] = KVPool()
        self._layers: list[_Layer] = []
        self._index: dict[str, int] = {}
        self._block_size = compat.cache_block_size(vllm_config)
        self._shift: RotaryShift | None = None
        self._slab: KVSlab | None = None
        self._pending: dict[tuple[str, FactKey], list[torch.Tensor | None]] = {}
        self._load_errors: set[int] = set()

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Learn the cache layout of every layer (before any request ran)."""
        names = sorted(kv_caches, key=compat.layer_index)
        modules = compat.attention_layers(self._config, names)
        heads, head_dim = compat.kv_heads_and_dim(self._config)
        probed: dict[tuple[Any, ...], CacheLayout] = {}
        for name in names:
            cache = kv_caches[name]
            write = compat.cache_writer(modules[name], cache)
            signature = (tuple(cache.shape), cache.stride(), cache.dtype)
            if signature not in probed:
                probed[signature] = probe_layout(cache, write, self._block_size, heads, head_dim)
            self._layers.append(_Layer(name, flat_view(cache), probed[signature], write))
        self._index = {layer.name: i for i, layer in enumerate(self._layers)}
        first = kv_caches[names[0]]
        self._slab = KVSlab(len(names), heads, head_dim, first.dtype, first.device)
        self._shift = RotaryShift.from_rotary_module(compat.model_rotary_module(head_dim))
        logger.info("inferscale connector: %d layers, layouts probed: %d",
                    len(self._layers), len(probed))

    # -- loading (before the forward pass) ---------------------------------------------

    def start_load(self, plan: StepPlan) -> None:
        """Write every load of this step into the paged cache, then apply evictions."""
        parts = [part for op in plan.loads for part in self._gather(op)]
        if parts:
            assert self._shift is not None and self._slab is not None
            device = self._slab.data.device
            rows = torch.cat([p[0] for p in parts]).to(device)
            deltas = torch.cat([p[1] for p in parts])
            slots = torch.cat([p[2] for p in parts]).to(device)
            keys, values = self._slab.gather(rows)  # [layers, n, heads, head_dim]
            keys = self._shift.apply(keys, self._shift.prepare(deltas, device))
            for i, layer in enumerate(self._layers):
                layer.write(keys[i], values[i], slots)
        for key in plan.evicts:
            self._drop(key)

    def _gather(self, op: LoadOp) -> list[tuple[torch.Tensor, ...]]:
        """(slab rows, position deltas, cache slots) of each piece of one request."""
        parts = []
        for key, offset, length, position in op.pieces:
            entry = self.pool.get(key)
            if entry is None or offset + length > entry.num_tokens:
                # The scheduler believed this fact exists; let vLLM recompute its blocks.
                logger.warning("fact %s missing from the KV pool; recomputing", key)
                self._load_errors.update(self._blocks_of(op.block_ids, position, length))
                continue
            first = entry.offset + offset
            delta = position - (entry.start + offset)
            parts.append((torch.arange(first, first + length),
                          torch.full((length,), delta, dtype=torch.int64),
                          self._slots(op.block_ids, torch.arange(position, position + length))))
        return parts

    def _drop(self, key: FactKey) -> None:
        entry = self.pool.get(key)
        if entry is not None and self.pool.evict(key):
            assert self._slab is not None
            self._slab.free(entry.offset, entry.num_tokens)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # -- capturing (after each layer's attention) --------------------------------------

    def save_layer(self, layer_name: str, plan: StepPlan) -> None:
        """Copy this layer's K/V of every span captured in this step."""
        layer_id = self._index.get(layer_name)
        if layer_id is None:
            return
        layer = self._layers[layer_id]
        for op in plan.captures:
            for span in op.spans:
                positions = torch.arange(span.start, span.end)
                slots = self._slots(op.block_ids, positions).to(layer.flat.device)
                kv = layer.flat[layer.layout.indices(slots)]  # [2, n, heads, head_dim]
                buffers = self._pending.setdefault((op.req_id, span.key),
                                                   [None] * len(self._layers))
                buffers[layer_id] = kv

    def finish_save(self, plan: StepPlan) -> None:
        """Move every fully captured span of this step into the pool."""
        for op in plan.captures:
            for span in op.spans:
                buffers = self._pending.pop((op.req_id, span.key), None)
                if buffers is None or any(b is None for b in buffers):
                    logger.warning("capture of %s incomplete; not stored", span.key)
                    continue
                stacked = torch.stack(buffers, dim=1)  # [2, layers, n, heads, head_dim]
                self._store(span.key, stacked, span.start)

    def _store(self, key: FactKey, kv: torch.Tensor, start: int) -> None:
        assert self._slab is not None
        self._drop(key)
        num_tokens = int(kv.shape[2])
        offset = self._slab.allocate(num_tokens)
        self._slab.write(offset, kv[0], kv[1])
        nbytes = num_tokens * self._slab.bytes_per_token
        self.pool.put(key, PoolEntry(offset, num_tokens, start, nbytes))

    # -- helpers -----------------------------------------------------------------------

    def _slots(self, block_ids: list[int], positions: torch.Tensor) -> torch.Tensor:
        size = self._block_size
        table = torch.tensor(block_ids, dtype=torch.int64)
        return table[positions // size] * size + positions % size

    def _blocks_of(self, block_ids: list[int], position: int, length: int) -> set[int]:
        first, last = position // self._block_size, (position + length - 1) // self._block_size
        return set(block_ids[first:last + 1])

"""Worker side of the connector: capture fact KV into the pool, inject it into blocks.

Runs inside each vLLM worker process, next to the paged KV cache, and follows each step's
plan from the scheduler side: the pool moves between the fact tiers
(:class:`~inferscale_memory.kv.tiers.FactTiers`), the loads written into the paged
caches before the forward pass (:class:`~inferscale_memory.kv.paged.PagedCaches`) and the
captures read out of each layer after its attention ran. Reads go through the cache map
learned by :func:`~inferscale_memory.kv.cache_map.probe_cache_map`; writes go through the
attention backend's own cache writer (or the probed offsets), so no memory layout is
assumed anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch

from inferscale_memory.connector.params import FactKey
from inferscale_memory.connector.plan import DEMOTE, PROMOTE, LoadOp, StepPlan, blocks_of
from inferscale_memory.driver import engine as driver
from inferscale_memory.kv import fused
from inferscale_memory.kv.cache_map import CacheMap, Fp8Probe, flat_view, probe_cache_map
from inferscale_memory.kv.fused import FusedInjector
from inferscale_memory.kv.paged import PagedCaches, PagedLayer
from inferscale_memory.kv.quant import Fp8Cache, fp8_format, layer_scales
from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.slab import KVSlab
from inferscale_memory.kv.staging import HostStage
from inferscale_memory.kv.tiers import FactTiers

logger = logging.getLogger(__name__)

# A file path: every load step appends ``{"ms", "requests", "tokens", "fused"}`` to it.
TIMING_ENV = "INFERSCALE_CONNECTOR_TIMING"


@dataclass
class _Capture:
    """The spans captured in one step: their cache slots, and K/V gathered per layer."""

    slots: torch.Tensor
    kv: list[torch.Tensor | None]
    indices: dict[int, torch.Tensor] = field(default_factory=dict)  # by id(cache_map)


class WorkerSide:
    """One worker's (one tensor-parallel rank's) side: its fact tiers and the paged caches
    it loads facts into and captures them from, step by step as the plan says."""

    def __init__(self, vllm_config: Any) -> None:
        self._config = vllm_config
        self._block_size = driver.cache_block_size(vllm_config)
        self.tiers: FactTiers[FactKey] | None = None  # from register
        self.caches: PagedCaches | None = None  # from register
        self._fp8_scales: list[tuple[float, float]] = []  # as read at register, by layer
        self._stage: HostStage | None = None  # index arrays' one copy per step
        self._capture: _Capture | None = None  # this step's captures, layer by layer
        self._load_errors: set[int] = set()
        # Load-time log for benchmarks (synchronises the device after each load step).
        self._timing = os.environ.get(TIMING_ENV) or None

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Learn the cache map of every layer (before any request ran)."""
        names = sorted(kv_caches, key=driver.layer_index)
        modules = driver.attention_layers(self._config, names)
        heads, head_dim = driver.kv_heads_and_dim(self._config)
        float8 = fp8_format(driver.kv_cache_dtype(self._config))
        scales = _read_scales([modules[name] for name in names], heads) \
            if float8 is not None else []
        probed: dict[tuple[Any, ...], CacheMap] = {}
        layers = []
        for i, name in enumerate(names):
            cache = kv_caches[name]
            write = driver.cache_writer(modules[name], cache)
            # Layers share a probe when their caches and (fp8) scales look alike.
            signature = (tuple(cache.shape), cache.stride(), cache.dtype,
                         tuple(scales[i].flatten().tolist()) if scales else None)
            if signature not in probed:
                probe = None if float8 is None else Fp8Probe(
                    float8, driver.model_dtype(self._config), scales[i][0], scales[i][1])
                probed[signature] = probe_cache_map(cache, write, self._block_size, heads,
                                                    head_dim, probe)
            flat = flat_view(cache)
            if float8 is not None:
                flat = flat.view(torch.uint8)  # vLLM's fp8 caches: bytes, as uint8 or float8
            layers.append(PagedLayer(name, flat, probed[signature], write, modules[name]))
        first = layers[0].flat
        fp8 = None if float8 is None else Fp8Cache(float8, torch.stack(scales).to(first.device))
        budget = driver.pool_budget_tokens(self._config)
        device = KVSlab(len(names), heads, head_dim, first.dtype, first.device,
                        max_capacity=budget)
        host_budget = driver.host_pool_budget_tokens(self._config)
        host = KVSlab(len(names), heads, head_dim, first.dtype, "cpu", max_capacity=host_budget,
                      pin_memory=first.is_cuda) if host_budget else None
        self.tiers = FactTiers(device, host)
        shift = RotaryShift.from_rotary_module(
            driver.model_rotary_module(head_dim)).on(first.device)
        cache_maps = [layer.cache_map for layer in layers]
        kernel = None
        if fused.available(first.device, first.dtype, device.data.dtype, cache_maps):
            kernel = FusedInjector([layer.flat for layer in layers], cache_maps[0], heads,
                                   head_dim, shift.rotary_dim, shift.is_neox_style, fp8)
        self.caches = PagedCaches(layers, shift, fp8, kernel)
        self._fp8_scales = self._scale_floats() if fp8 is not None else []
        logger.info("inferscale connector: %d layers, cache maps probed: %d, cache: %s, "
                    "loads: %s", len(layers), len(probed),
                    driver.kv_cache_dtype(self._config),
                    "fused Triton kernel" if kernel else "per-layer cache writes")

    def _scale_floats(self) -> list[tuple[float, float]]:
        assert self.caches is not None
        return [driver.kv_scale_floats(layer.module) for layer in self.caches.layers]

    # -- loading (before the forward pass) ---------------------------------------------

    def start_load(self, plan: StepPlan) -> None:
        """Apply the step's pool moves, write every load into the paged cache, then apply
        evictions."""
        tiers, caches = self.tiers, self.caches
        assert tiers is not None
        started = time.perf_counter() if self._timing is not None else 0.0
        if caches is not None and caches.fp8 is not None and (plan.loads or plan.captures):
            self._check_fp8_scales()
        # Deleted facts and the old KV of recaptured ones give their rows back first if
        # no load of this step reads them: the scheduler side already counts them free,
        # possibly for this step's moves.
        loaded = {piece[0] for op in plan.loads for piece in op.pieces}
        recaptured = [span.key for op in plan.captures for span in op.spans]
        for key in [*plan.evicts, *recaptured]:
            if key not in loaded:
                tiers.drop(key)
        for move, key in plan.moves:
            if move == DEMOTE:
                tiers.demote(key)
            elif move == PROMOTE:
                tiers.promote(key)
            else:
                tiers.drop(key)
        batch = self._load_batch(plan.loads)
        if batch is not None:
            assert caches is not None
            rows, deltas, slots = self._to_device(batch)  # the step's one copy
            reach = int(np.abs(batch[1]).max()) + 1  # from the host copy: no device read
            rotation = caches.shift.rotation(deltas, reach) if reach > 1 else None
            caches.write(tiers.device, rows, slots, rotation)
            if self._timing is not None:
                self._log_load(started, plan, batch.shape[1])
        for key in plan.evicts:
            if key in loaded:
                tiers.drop(key)

    def _check_fp8_scales(self) -> None:
        """Forget every fact if a layer's fp8 scales changed since the caches were
        registered (a weight reload): their bytes were quantized with the old scales.
        Their loads then fail and vLLM computes them again."""
        caches, tiers = self.caches, self.tiers
        assert caches is not None and caches.fp8 is not None and tiers is not None
        now = self._scale_floats()
        if now == self._fp8_scales:
            return
        logger.warning("the fp8 KV cache's scales changed; forgetting %d facts (they are "
                       "computed again)", tiers.drop_all())
        scales = _read_scales([layer.module for layer in caches.layers],
                              caches.fp8.scales.shape[-1])
        caches.fp8 = Fp8Cache(caches.fp8.dtype, torch.stack(scales).to(caches.fp8.scales.device))
        self._fp8_scales = now

    def _log_load(self, started: float, plan: StepPlan, tokens: int) -> None:
        """One line of the load-time log (the device is synchronised first)."""
        assert self.tiers is not None and self.caches is not None and self._timing is not None
        if self.tiers.device.data.is_cuda:
            torch.cuda.synchronize(self.tiers.device.data.device)
        ms = (time.perf_counter() - started) * 1000
        with open(self._timing, "a") as log:
            log.write(json.dumps({"ms": ms, "requests": len(plan.loads), "tokens": tokens,
                                  "fused": self.caches.fused is not None}) + "\n")

    def _load_batch(self, loads: list[LoadOp]) -> np.ndarray | None:
        """``[3, n]`` slab rows, position deltas and cache slots of every token loaded.

        Python touches each piece once (a pool lookup); the per-token arrays are built
        with a few vectorised numpy operations for the whole step.
        """
        assert self.tiers is not None
        rows, lengths, positions, deltas, tables, table_base = [], [], [], [], [], []
        base = 0
        get = self.tiers.pool.get
        for op in loads:
            num_pieces = len(lengths)
            for key, offset, length, position in op.pieces:
                entry = get(key)
                if entry is None or offset + length > len(entry.rows):
                    # The scheduler believed this fact exists; let vLLM recompute its blocks.
                    logger.warning("fact %s missing from the KV pool; recomputing", key)
                    self._load_errors.update(
                        blocks_of(op.block_ids, self._block_size, position, length))
                    continue
                fact_rows = entry.rows
                rows.append(fact_rows if offset == 0 and length == len(fact_rows)
                            else fact_rows[offset:offset + length])
                lengths.append(length)
                positions.append(position)
                deltas.append(position - entry.start - offset)
            if len(lengths) > num_pieces:
                table_base += [base] * (len(lengths) - num_pieces)
                tables.append(op.block_ids)
                base += len(op.block_ids)
        if not lengths:
            return None
        size = self._block_size
        count = np.asarray(lengths, dtype=np.int64)
        within = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(count) - count, count)
        pos = np.repeat(np.asarray(positions, dtype=np.int64), count) + within
        table = np.fromiter(chain.from_iterable(tables), dtype=np.int64, count=base)
        blocks = table[np.repeat(np.asarray(table_base, dtype=np.int64), count) + pos // size]
        return np.stack((np.concatenate(rows),
                         np.repeat(np.asarray(deltas, dtype=np.int64), count),
                         blocks * size + pos % size))

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # -- capturing (after each layer's attention) --------------------------------------

    def save_layer(self, layer_name: str, plan: StepPlan) -> None:
        """Copy this layer's K/V of every span captured in this step (one gather)."""
        assert self.caches is not None
        layer_id = self.caches.index.get(layer_name)
        if layer_id is None or not plan.captures:
            return
        layer = self.caches.layers[layer_id]
        if self._capture is None:
            slots = torch.cat([self._slots(op.block_ids, torch.arange(span.start, span.end))
                               for op in plan.captures for span in op.spans])
            self._capture = _Capture(self._to_device(slots.numpy()),
                                     [None] * len(self.caches.layers))
        capture = self._capture
        indices = capture.indices.get(id(layer.cache_map))
        if indices is None:
            indices = capture.indices[id(layer.cache_map)] = layer.cache_map.indices(capture.slots)
        capture.kv[layer_id] = layer.flat[indices]  # [2, n, heads, head_dim]

    def finish_save(self, plan: StepPlan) -> None:
        """Move every span captured in this step into the pool."""
        capture, self._capture = self._capture, None
        spans = [(op.req_id, span) for op in plan.captures for span in op.spans]
        if capture is None or not spans:
            return
        tiers = self.tiers
        assert tiers is not None
        for _, span in spans:  # the old KV of a recaptured fact: its rows are free already
            tiers.drop(span.key)  # in the scheduler side's count, and it is not the new text's
        if any(kv is None for kv in capture.kv):  # a load of these facts fails: recomputed
            logger.warning("capture of %d spans incomplete; not stored", len(spans))
            return
        allocated = [tiers.allocate(span.end - span.start) for _, span in spans]
        kv = torch.stack(capture.kv, dim=1)  # [2, layers, n, heads, head_dim]
        kept = [i for i, rows in enumerate(allocated) if rows is not None]
        if len(kept) < len(spans):  # token columns of the spans that found room
            sizes = [span.end - span.start for _, span in spans]
            firsts = [sum(sizes[:i]) for i in range(len(spans))]
            columns = torch.cat([torch.arange(firsts[i], firsts[i] + sizes[i]) for i in kept]
                                or [torch.empty(0, dtype=torch.int64)])
            kv = kv.index_select(2, columns.to(kv.device))
        spans = [spans[i] for i in kept]
        stored = [rows for rows in allocated if rows is not None]
        if not spans:
            return
        tiers.device.write_rows(self._to_device(np.concatenate(stored)), kv[0], kv[1])
        for span_rows, (_, span) in zip(stored, spans, strict=True):
            tiers.store(span.key, span_rows, span.start)

    # -- helpers -----------------------------------------------------------------------

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        """``array`` on the slab's device, in one copy through page-locked memory."""
        assert self.tiers is not None
        if self._stage is None:
            self._stage = HostStage(self.tiers.device.data.device)
        return self._stage.to_device(array)

    def _slots(self, block_ids: list[int], positions: torch.Tensor) -> torch.Tensor:
        size = self._block_size
        table = torch.tensor(block_ids, dtype=torch.int64)
        return table[positions // size] * size + positions % size


def _read_scales(modules: list[Any], heads: int) -> list[torch.Tensor]:
    """Each attention layer's fp8 K and V scales as ``[2, heads]`` (on the CPU)."""
    return [layer_scales(*driver.kv_scales(module), heads) for module in modules]

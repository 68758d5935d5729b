"""Contiguous device storage for the KV of every captured fact.

One tensor ``[capacity, layers, 2, heads, head_dim]`` (token rows first; K then V) holds
all facts, so the loads of a whole engine step are one gather of the rows they need,
whatever the number of requests, facts and layers. A gather reads only those rows: its
cost does not grow with the number of facts stored. Token rows are handed out first-fit
from a free list; the slab doubles when it is full. At its maximum, a fact's rows may come
from several free runs, so a slab never refuses rows it has free (facts of varying length
would otherwise fragment a full slab).
"""

from __future__ import annotations

import bisect

import numpy as np
import torch


class SlabFullError(RuntimeError):
    """No free run of rows is long enough and the slab may not grow."""


FIRST_ROWS = 4096  # a slab's rows at first (at most its maximum); it doubles from there


class KVSlab:
    """Token rows of fact KV on the engine's device, at most ``max_capacity`` of them."""

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, capacity: int = FIRST_ROWS,
                 max_capacity: int | None = None, pin_memory: bool = False) -> None:
        self.max_capacity = max_capacity
        self.pin_memory = pin_memory  # page-locked host rows (fast, asynchronous copies)
        if max_capacity is not None:
            capacity = min(capacity, max_capacity)
        self.data = torch.zeros((capacity, layers, 2, heads, head_dim), dtype=dtype,
                                device=device, pin_memory=pin_memory)
        self._free: list[tuple[int, int]] = [(0, capacity)]  # (offset, length), sorted

    @property
    def capacity(self) -> int:
        return int(self.data.shape[0])

    @property
    def bytes_per_token(self) -> int:
        return self.data[:1].nbytes

    @property
    def free_rows(self) -> int:
        return sum(length for _, length in self._free)

    def allocate(self, num_tokens: int) -> int:
        """Reserve ``num_tokens`` consecutive rows; returns the first one.

        Raises:
            SlabFullError: No free run fits and the slab is at ``max_capacity``.
        """
        for i, (offset, length) in enumerate(self._free):
            if length >= num_tokens:
                rest = (offset + num_tokens, length - num_tokens)
                self._free[i:i + 1] = [rest] if rest[1] else []
                return offset
        self._grow(num_tokens)
        return self.allocate(num_tokens)

    def allocate_rows(self, num_tokens: int) -> np.ndarray:
        """Reserve ``num_tokens`` rows; returns them (int64, in token order).

        Consecutive when a free run is long enough (growing the slab for that while it
        may); else taken from several free runs, lowest first.

        Raises:
            SlabFullError: Fewer than ``num_tokens`` rows are free and the slab may not grow.
        """
        try:
            first = self.allocate(num_tokens)
            return np.arange(first, first + num_tokens, dtype=np.int64)
        except SlabFullError:
            if self.max_capacity is not None and self.capacity < self.max_capacity:
                self._grow(self.max_capacity - self.capacity)
            if self.free_rows < num_tokens:
                raise
        runs, need = [], num_tokens
        while need:
            offset, length = self._free[0]
            take = min(length, need)
            runs.append(np.arange(offset, offset + take, dtype=np.int64))
            if take == length:
                self._free.pop(0)
            else:
                self._free[0] = (offset + take, length - take)
            need -= take
        return np.concatenate(runs)

    def release(self, rows: np.ndarray) -> None:
        """Give back rows of :meth:`allocate_rows` (run by run)."""
        if len(rows) == 0:
            return
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        for run in np.split(rows, breaks):
            self.free(int(run[0]), len(run))

    def copy_rows(self, rows: np.ndarray, source: KVSlab, source_rows: np.ndarray,
                  non_blocking: bool = False) -> None:
        """Copy ``source``'s ``source_rows`` into this slab's ``rows`` (across devices)."""
        if _consecutive(rows) and _consecutive(source_rows):
            first, other, n = int(rows[0]), int(source_rows[0]), len(rows)
            self.data[first:first + n].copy_(source.data[other:other + n],
                                             non_blocking=non_blocking)
            return
        picked = source.data[torch.from_numpy(source_rows).to(source.data.device)]
        self.data[torch.from_numpy(rows).to(self.data.device)] = picked.to(self.data.device)

    def free(self, offset: int, num_tokens: int) -> None:
        """Give rows back (merged with the free ranges next to them)."""
        i = bisect.bisect(self._free, (offset, num_tokens))
        start, end = offset, offset + num_tokens
        if i < len(self._free) and self._free[i][0] == end:
            end += self._free.pop(i)[1]
        if i > 0 and sum(self._free[i - 1]) == start:
            i -= 1
            start = self._free.pop(i)[0]
        self._free.insert(i, (start, end - start))

    def write_rows(self, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``[layers, n, heads, head_dim]`` K and V at any ``rows`` ``[n]``."""
        self.data[rows] = torch.stack((keys, values), dim=2).transpose(0, 1)

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[layers, n, heads, head_dim]`` of ``rows`` (contiguous per layer)."""
        picked = self.data.index_select(0, rows)  # [n, layers, 2, heads, head_dim]
        both = picked.permute(2, 1, 0, 3, 4).contiguous()
        return both[0], both[1]

    def gather_layer(self, rows: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[n, heads, head_dim]`` of ``rows`` in one ``layer`` (new tensors)."""
        picked = self.data[:, layer].index_select(0, rows)  # [n, 2, heads, head_dim]
        return picked[:, 0].contiguous(), picked[:, 1].contiguous()

    def _grow(self, at_least: int) -> None:
        old = self.capacity
        new = max(2 * old, old + at_least)
        if self.max_capacity is not None:
            if old + at_least > self.max_capacity:
                raise SlabFullError(f"no {at_least} free rows in a slab of {old}")
            new = min(new, self.max_capacity)
        grown = torch.zeros((new, *self.data.shape[1:]), dtype=self.data.dtype,
                            device=self.data.device, pin_memory=self.pin_memory)
        grown[:old] = self.data
        self.data = grown
        self.free(old, new - old)


def _consecutive(rows: np.ndarray) -> bool:
    return len(rows) == 0 or int(rows[-1]) - int(rows[0]) + 1 == len(rows)

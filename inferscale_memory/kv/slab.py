"""Contiguous device storage for the KV of every captured fact.

One tensor ``[2, layers, capacity, heads, head_dim]`` (K then V) holds all facts, so the
loads of a whole engine step are one index per step and one gather per layer, whatever
the number of requests and facts. Token rows are handed out first-fit from a free list;
the slab doubles when it is full.
"""

from __future__ import annotations

import torch


class KVSlab:
    """Token rows of fact KV on the engine's device."""

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, capacity: int = 4096) -> None:
        self.data = torch.zeros((2, layers, capacity, heads, head_dim), dtype=dtype,
                                device=device)
        self._free: list[tuple[int, int]] = [(0, capacity)]  # (offset, length), sorted

    @property
    def capacity(self) -> int:
        return int(self.data.shape[2])

    @property
    def bytes_per_token(self) -> int:
        return self.data[:, :, :1].nbytes

    def allocate(self, num_tokens: int) -> int:
        """Reserve ``num_tokens`` consecutive rows; returns the first one."""
        for i, (offset, length) in enumerate(self._free):
            if length >= num_tokens:
                rest = (offset + num_tokens, length - num_tokens)
                self._free[i:i + 1] = [rest] if rest[1] else []
                return offset
        self._grow(num_tokens)
        return self.allocate(num_tokens)

    def free(self, offset: int, num_tokens: int) -> None:
        """Give rows back (adjacent free ranges are merged)."""
        self._free.append((offset, num_tokens))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free = merged

    def write(self, offset: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``[layers, n, heads, head_dim]`` K and V at rows ``offset..offset+n``."""
        n = keys.shape[1]
        self.data[0, :, offset:offset + n] = keys
        self.data[1, :, offset:offset + n] = values

    def gather(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[n, heads, head_dim]`` of ``rows`` in one layer."""
        both = self.data[:, layer].index_select(1, rows)
        return both[0], both[1]

    def _grow(self, at_least: int) -> None:
        old = self.capacity
        new = max(2 * old, old + at_least)
        shape = list(self.data.shape)
        shape[2] = new
        grown = torch.zeros(shape, dtype=self.data.dtype, device=self.data.device)
        grown[:, :, :old] = self.data
        self.data = grown
        self.free(old, new - old)

"""The worker-resident KV pool: which facts are stored where.

The KV itself lives in a :class:`~inferscale_memory.kv.slab.KVSlab`; an entry names its
rows. Keys are kept as captured (rotated at their capture positions, see :mod:`.rope`).
Which facts stay is decided by the scheduler side's registry
(:mod:`inferscale_memory.connector.registry`); the pool keeps no eviction order of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K")


@dataclass(frozen=True, eq=False)
class PoolEntry:
    """Where one fact's KV lives: its slab rows, one per token in order."""

    rows: np.ndarray  # int64 slab rows
    start: int  # prompt position of the first token when it was captured
    nbytes: int  # K and V of all layers

    @property
    def num_tokens(self) -> int:
        return len(self.rows)


class KVPool(Generic[K]):
    """Fact KV entries by key."""

    def __init__(self) -> None:
        self._entries: dict[K, PoolEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def put(self, key: K, entry: PoolEntry) -> None:
        self.evict(key)
        self._entries[key] = entry

    def get(self, key: K) -> PoolEntry | None:
        return self._entries.get(key)

    def evict(self, key: K) -> bool:
        entry = self._entries.pop(key, None)
        return entry is not None

    def keys(self) -> list[K]:
        """The keys held now (a copy: evicting while walking it is safe)."""
        return list(self._entries)

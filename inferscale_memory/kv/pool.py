"""The worker-resident KV pool: which facts are stored where, least recently used first.

The KV itself lives in a :class:`~inferscale_memory.kv.slab.KVSlab`; an entry names its
rows. Keys are kept as captured (rotated at their capture positions, see :mod:`.rope`).
"""

from __future__ import annotations

from collections import OrderedDict
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
    """Fact KV entries, least recently used first."""

    def __init__(self) -> None:
        self._entries: OrderedDict[K, PoolEntry] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def lru_order(self) -> list[K]:
        """The keys, least recently used first."""
        return list(self._entries)

    def put(self, key: K, entry: PoolEntry) -> None:
        self.evict(key)
        self._entries[key] = entry
        self.nbytes += entry.nbytes

    def get(self, key: K) -> PoolEntry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def evict(self, key: K) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.nbytes -= entry.nbytes
        return True

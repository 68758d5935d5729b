"""The fact pool's two tiers: facts' rows on the engine's device, and in host memory.

Each tier is a :class:`~inferscale_memory.kv.pool.KVPool` (which fact, where) over a
:class:`~inferscale_memory.kv.slab.KVSlab` (the rows). The device tier serves loads; the
optional host tier (``kv_host_pool_gb``) keeps facts demoted from the device, to be
promoted back instead of being recomputed. Which facts move is decided by the scheduler
side's registry (:mod:`inferscale_memory.connector.registry`); the tiers do what the step
plan says and never pick a victim of their own.
"""

from __future__ import annotations

import logging
from typing import Generic

import numpy as np

from inferscale_memory.kv.pool import K, KVPool, PoolEntry
from inferscale_memory.kv.slab import KVSlab, SlabFullError

logger = logging.getLogger(__name__)


class FactTiers(Generic[K]):
    """The device tier (``device``, ``pool``) and the host tier (``host``, ``host_pool``;
    ``host`` is ``None`` without one) of one worker."""

    def __init__(self, device: KVSlab, host: KVSlab | None = None) -> None:
        self.device, self.host = device, host
        self.pool: KVPool[K] = KVPool()
        self.host_pool: KVPool[K] = KVPool()  # demoted facts, in host memory

    def __len__(self) -> int:
        return len(self.pool) + len(self.host_pool)

    def store(self, key: K, rows: np.ndarray, start: int) -> None:
        """Name device ``rows`` (already written) as ``key``'s KV, captured at ``start``."""
        self.drop(key)  # a key stored twice keeps the last copy
        self.pool.put(key, PoolEntry(rows, start, len(rows) * self.device.bytes_per_token))

    def allocate(self, num_tokens: int, host: bool = False) -> np.ndarray | None:
        """Rows of the device slab (or of the host tier), or ``None`` if there is no room.

        The scheduler side's registry keeps both tiers within their budgets and sends
        every drop it decides in the step plan, and a slab hands out any free rows, so
        this finds room. Rows that cannot be found are not stored (a load of that fact
        then fails, vLLM recomputes it and the scheduler side forgets it), never an error
        that would stop the engine.
        """
        slab = self.host if host else self.device
        assert slab is not None
        try:
            return slab.allocate_rows(num_tokens)
        except SlabFullError:
            logger.warning("no room for %d tokens of fact KV; not stored", num_tokens)
            return None

    def drop(self, key: K) -> None:
        """Forget ``key`` in both tiers."""
        for pool, slab in ((self.pool, self.device), (self.host_pool, self.host)):
            entry = pool.get(key)
            if entry is not None and pool.evict(key):
                assert slab is not None
                slab.release(entry.rows)

    def drop_all(self) -> int:
        """Forget every fact; returns how many there were."""
        keys = [*self.pool.keys(), *self.host_pool.keys()]
        for key in keys:
            self.drop(key)
        return len(keys)

    def demote(self, key: K) -> None:
        """Copy a fact's rows to the host tier and free them on the device (without a
        host tier, or without room there, the fact is dropped)."""
        entry = self.pool.get(key)
        if entry is None or self.host is None:
            self.drop(key)
            return
        rows = self.allocate(entry.num_tokens, host=True)
        if rows is not None:
            self.host.copy_rows(rows, self.device, entry.rows)
        self.drop(key)  # frees the device rows
        if rows is not None:
            self.host_pool.put(key, PoolEntry(rows, entry.start, entry.nbytes))

    def promote(self, key: K) -> None:
        """Copy a demoted fact's rows back to the device (before this step's loads)."""
        entry = self.host_pool.get(key)
        if entry is None:
            return  # dropped here meanwhile: its load fails and vLLM recomputes it
        assert self.host is not None
        rows = self.allocate(entry.num_tokens)
        if rows is not None:  # stream-ordered before any later write of the host rows
            self.device.copy_rows(rows, self.host, entry.rows, non_blocking=True)
        self.drop(key)  # frees the host rows
        if rows is not None:
            self.pool.put(key, PoolEntry(rows, entry.start, entry.nbytes))

"""The worker's KV pool: entries by key."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferscale_memory.connector.params import FactKey
from inferscale_memory.kv.pool import KVPool, PoolEntry

LAYERS, HEADS, HEAD = 3, 2, 8


def entry(tokens: int, start: int = 0, dtype: torch.dtype = torch.bfloat16,
          fill: float = 1.0) -> PoolEntry:
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = np.arange(int(fill), int(fill) + tokens, dtype=np.int64)
    return PoolEntry(rows, start, 2 * LAYERS * tokens * HEADS * HEAD * itemsize)


def test_entry_sizes() -> None:
    e = entry(5, start=7)
    assert e.num_tokens == 5
    assert e.start == 7
    assert e.nbytes == 2 * LAYERS * 5 * HEADS * HEAD * 2  # K and V, 2 bytes each
    assert entry(5, dtype=torch.float32).nbytes == 2 * e.nbytes


def test_put_get_and_contains() -> None:
    pool: KVPool[FactKey] = KVPool()
    a, b = FactKey("alice", "a"), FactKey("", "header:x")
    ea, eb = entry(4), entry(6, start=3)
    assert len(pool) == 0
    assert pool.get(a) is None
    pool.put(a, ea)
    pool.put(b, eb)
    assert len(pool) == 2
    assert a in pool and b in pool and FactKey("bob", "a") not in pool
    assert pool.get(a) == ea and pool.get(b) == eb


def test_put_replaces() -> None:
    pool: KVPool[FactKey] = KVPool()
    a = FactKey("alice", "a")
    pool.put(a, entry(10))
    new = entry(3, start=5, fill=7.0)
    pool.put(a, new)
    assert len(pool) == 1
    assert pool.get(a) == new


def test_evict() -> None:
    pool: KVPool[FactKey] = KVPool()
    a, b = FactKey("alice", "a"), FactKey("alice", "b")
    pool.put(a, entry(4))
    pool.put(b, entry(2))
    assert pool.evict(a) is True
    assert pool.evict(a) is False  # already gone
    assert pool.evict(FactKey("alice", "never")) is False
    assert a not in pool and pool.get(a) is None
    assert len(pool) == 1
    assert pool.evict(b) is True
    assert len(pool) == 0


@pytest.mark.parametrize("seed", range(3))
def test_the_pool_holds_what_was_put_after_random_operations(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pool: KVPool[FactKey] = KVPool()
    model: dict[FactKey, PoolEntry] = {}
    for _ in range(200):
        key = FactKey("t", str(int(torch.randint(0, 8, (1,), generator=g))))
        op = int(torch.randint(0, 3, (1,), generator=g))
        if op == 0:
            e = entry(int(torch.randint(1, 6, (1,), generator=g)))
            pool.put(key, e)
            model[key] = e
        elif op == 1:
            assert pool.get(key) is model.get(key)
        else:
            assert pool.evict(key) is (model.pop(key, None) is not None)
        assert len(pool) == len(model)
        assert all(key in pool for key in model)


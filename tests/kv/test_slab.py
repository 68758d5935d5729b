"""The slab that holds every fact's KV: row allocation, growth, gathers."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import torch

from inferscale_memory.kv.slab import KVSlab

LAYERS, HEADS, HEAD = 3, 2, 8


def test_rows_are_reused_and_grow_keeps_data() -> None:
    slab = KVSlab(LAYERS, HEADS, HEAD, torch.float32, "cpu", capacity=8)
    first = slab.allocate(5)
    kv = torch.randn(2, LAYERS, 5, HEADS, HEAD)
    slab.write_rows(torch.arange(first, first + kv.shape[2]), kv[0], kv[1])
    second = slab.allocate(6)  # does not fit: the slab doubles, old rows survive
    assert slab.capacity >= 11 and second >= 5
    keys, values = slab.gather(torch.arange(first, first + 5))
    assert torch.equal(keys, kv[0]) and torch.equal(values, kv[1])
    assert all(keys[i].is_contiguous() and values[i].is_contiguous() for i in range(LAYERS))
    slab.free(first, 5)
    assert slab.allocate(5) == first  # freed rows are handed out again
    assert slab.bytes_per_token == 2 * LAYERS * HEADS * HEAD * 4


def test_gather_picks_rows_from_several_facts_in_order() -> None:
    slab = KVSlab(LAYERS, HEADS, HEAD, torch.float32, "cpu", capacity=16)
    a, b = slab.allocate(3), slab.allocate(4)
    kv_a, kv_b = torch.randn(2, LAYERS, 3, HEADS, HEAD), torch.randn(2, LAYERS, 4, HEADS, HEAD)
    slab.write_rows(torch.arange(a, a + kv_a.shape[2]), kv_a[0], kv_a[1])
    slab.write_rows(torch.arange(b, b + kv_b.shape[2]), kv_b[0], kv_b[1])
    rows = torch.tensor([b + 1, b + 2, a, a + 1, a + 2])
    keys, values = slab.gather(rows)
    assert torch.equal(keys, torch.cat([kv_b[0, :, 1:3], kv_a[0]], dim=1))
    assert torch.equal(values, torch.cat([kv_b[1, :, 1:3], kv_a[1]], dim=1))


def test_a_layer_gather_is_that_layer_of_the_whole_gather() -> None:
    # The portable injection path gathers one layer at a time (bounded memory at 64
    # requests x k=50) and rotates the keys in place: they must be copies.
    slab = KVSlab(LAYERS, HEADS, HEAD, torch.float32, "cpu", capacity=16)
    a = slab.allocate(6)
    kv = torch.randn(2, LAYERS, 6, HEADS, HEAD)
    slab.write_rows(torch.arange(a, a + kv.shape[2]), kv[0], kv[1])
    rows = torch.tensor([a + 4, a, a + 2])
    keys, values = slab.gather(rows)
    for layer in range(LAYERS):
        k, v = slab.gather_layer(rows, layer)
        assert torch.equal(k, keys[layer]) and torch.equal(v, values[layer])
        assert k.is_contiguous() and v.is_contiguous()
        k.zero_()
    assert torch.equal(slab.gather(rows)[0], keys)  # the slab is untouched


def test_free_list_merges_back_to_one_range() -> None:
    rng = random.Random(0)
    slab = KVSlab(1, 1, 4, torch.float32, "cpu", capacity=64)
    held = [(slab.allocate(n), n) for n in (rng.randint(1, 9) for _ in range(40))]
    rng.shuffle(held)
    for offset, n in held:
        slab.free(offset, n)
        starts = [o for o, _ in slab._free]
        assert starts == sorted(starts)
        assert all(o + n < nxt for (o, n), nxt in zip(slab._free[:-1], starts[1:], strict=True))
    assert slab._free == [(0, slab.capacity)]
    assert slab.free_rows == slab.capacity


def test_gather_reads_only_the_rows_it_needs() -> None:
    # A gather whose cost grows with the slab makes every request slower as facts are
    # captured (found in the TTFT benchmark: a copy of each layer per step). Peak memory
    # shows it without timing anything: the slab's zero pages are never touched, so a
    # copy of a layer would add its full size to the process's peak resident memory.
    code = textwrap.dedent("""
        import resource, torch
        from inferscale_memory.kv.slab import KVSlab
        slab = KVSlab(2, 1, 64, torch.float32, "cpu", capacity=400_000)  # 200 MiB
        rows = torch.arange(10, 50)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(3):
            slab.gather(rows)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert int(out) < 20, f"a gather of 40 rows grew the peak memory by {out.strip()} MiB"


def test_slab_grows_up_to_its_maximum_then_refuses() -> None:
    import pytest

    from inferscale_memory.kv.slab import SlabFullError

    slab = KVSlab(1, 1, 4, torch.float32, "cpu", capacity=8, max_capacity=20)
    first = slab.allocate(8)
    second = slab.allocate(10)  # grows to 18
    assert slab.capacity == 18 and second == first + 8
    assert slab.allocate(2) == 18  # grows to the maximum, 20, not to 36
    assert slab.capacity == 20
    with pytest.raises(SlabFullError):
        slab.allocate(1)
    assert slab.capacity == 20
    slab.free(first, 8)
    assert slab.allocate(8) == first  # freed rows serve again
    assert KVSlab(1, 1, 4, torch.float32, "cpu", capacity=4096, max_capacity=50).capacity == 50


def test_rows_come_from_several_free_runs_when_none_is_long_enough() -> None:
    import numpy as np

    slab = KVSlab(1, 1, 2, torch.float32, "cpu", capacity=12, max_capacity=12)
    a, b, c = (slab.allocate_rows(4) for _ in range(3))
    slab.release(a)
    slab.release(c)  # 8 rows free, in two runs of 4
    rows = slab.allocate_rows(6)
    assert sorted(rows.tolist()) == [0, 1, 2, 3, 8, 9]
    kv = torch.randn(2, 1, 6, 1, 2)
    slab.write_rows(torch.from_numpy(rows), kv[0], kv[1])
    keys, values = slab.gather(torch.from_numpy(rows))
    assert torch.equal(keys, kv[0]) and torch.equal(values, kv[1])
    assert slab.free_rows == 2
    slab.release(rows)
    slab.release(b)
    assert slab._free == [(0, 12)]
    assert np.array_equal(slab.allocate_rows(12), np.arange(12))


def test_a_pool_filled_to_its_budget_under_churn_never_runs_out_of_rows() -> None:
    # The scheduler keeps the facts within the budget in rows; with first-fit runs only,
    # facts of varying length fragment a full slab and a capture or promotion found no
    # run long enough (the soak with a small pool dropped facts for it). With rows from
    # several runs, a slab at its budget always has the rows the budget promises.
    from collections import OrderedDict

    from inferscale_memory.kv.slab import SlabFullError

    for capacity in (70, 2003):
        rng = random.Random(capacity)
        slab = KVSlab(1, 1, 1, torch.float32, "cpu", capacity=capacity, max_capacity=capacity)
        contiguous = KVSlab(1, 1, 1, torch.float32, "cpu", capacity=capacity,
                            max_capacity=capacity)
        held: OrderedDict[int, tuple[object, object]] = OrderedDict()
        used, contiguous_failures = 0, 0
        for i in range(3000):
            if rng.random() < 0.15 and held:  # a delete
                rows, first = held.pop(rng.choice(list(held)))
            else:
                n = rng.randint(10, 30)
                while used + n > capacity:  # the scheduler's LRU eviction
                    _, (old_rows, old_first) = held.popitem(last=False)
                    slab.release(old_rows)
                    if old_first is not None:
                        contiguous.free(*old_first)
                    used -= len(old_rows)
                rows = slab.allocate_rows(n)  # never SlabFullError here
                try:
                    first = (contiguous.allocate(n), n)
                except SlabFullError:
                    first, contiguous_failures = None, contiguous_failures + 1
                held[i] = (rows, first)
                used += n
                continue
            slab.release(rows)
            if first is not None:
                contiguous.free(*first)
            used -= len(rows)
        assert slab.free_rows == capacity - used
        assert contiguous_failures > 0  # what first-fit runs alone would have dropped


def test_rows_of_a_slab_below_its_maximum_come_from_growth_and_free_runs() -> None:
    slab = KVSlab(1, 1, 2, torch.float32, "cpu", capacity=8, max_capacity=12)
    a, b = slab.allocate_rows(4), slab.allocate_rows(4)
    slab.release(a)  # 4 free rows; 4 more before the maximum
    rows = slab.allocate_rows(6)  # no run of 6, even after growing: both together
    assert slab.capacity == 12 and len(set(rows.tolist())) == 6
    assert set(rows.tolist()).isdisjoint(b.tolist())

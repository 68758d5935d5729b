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
    slab.write(first, kv[0], kv[1])
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
    slab.write(a, kv_a[0], kv_a[1])
    slab.write(b, kv_b[0], kv_b[1])
    rows = torch.tensor([b + 1, b + 2, a, a + 1, a + 2])
    keys, values = slab.gather(rows)
    assert torch.equal(keys, torch.cat([kv_b[0, :, 1:3], kv_a[0]], dim=1))
    assert torch.equal(values, torch.cat([kv_b[1, :, 1:3], kv_a[1]], dim=1))


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

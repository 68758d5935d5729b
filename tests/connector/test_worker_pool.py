"""The worker side's pool bookkeeping on a real slab (no engine: the step's captured K/V
are given as the attention layers would have left them)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_memory.connector.params import FactKey, Span
from inferscale_memory.connector.plan import DEMOTE, CaptureOp, LoadOp, StepPlan, blocks_of
from inferscale_memory.connector.registry import FactRegistry, Registered, Room
from inferscale_memory.connector.worker import WorkerSide, _Capture
from inferscale_memory.kv.pool import PoolEntry
from inferscale_memory.kv.slab import KVSlab
from inferscale_memory.kv.tiers import FactTiers

LAYERS, HEADS, DIM = 2, 1, 4
A, B = FactKey("alice", "a"), FactKey("alice", "b")


def worker(rows: int) -> WorkerSide:
    side = WorkerSide(SimpleNamespace(cache_config=SimpleNamespace(block_size=16)))
    side.tiers = FactTiers(KVSlab(LAYERS, HEADS, DIM, torch.float32, "cpu", capacity=rows,
                                  max_capacity=rows))
    return side


def capture(side: WorkerSide, key: FactKey, tokens: int, fill: float) -> None:
    """One step that captured ``tokens`` tokens of ``key`` (positions 0..tokens)."""
    kv = torch.full((2, tokens, HEADS, DIM), fill)
    side._capture = _Capture(torch.arange(tokens), [kv] * LAYERS)
    side.finish_save(StepPlan(captures=[CaptureOp("r", [0], [Span(key, 0, tokens)])]))


def test_a_recapture_at_a_full_budget_replaces_its_own_rows() -> None:
    # The scheduler side counts a recaptured fact's old rows as free once it emits the
    # capture; the worker must give them back before taking new ones. It took the new rows
    # first, found the slab full and dropped the least recently used fact instead (a fact
    # the scheduler still listed: its next load failed). Seen in the soak with a small pool.
    side = worker(30)
    capture(side, B, 20, 1.0)
    capture(side, A, 10, 2.0)  # the slab is full; B is the least recently used
    capture(side, A, 10, 3.0)  # A updated
    assert B in side.tiers.pool and A in side.tiers.pool
    entry = side.tiers.pool.get(A)
    assert entry is not None
    keys, _ = side.tiers.device.gather(torch.from_numpy(entry.rows))
    assert torch.all(keys == 3.0)
    assert side.tiers.device.free_rows == 0


def test_a_key_captured_twice_in_one_step_keeps_one_copy() -> None:
    side = worker(30)
    kv = torch.cat([torch.full((2, 5, HEADS, DIM), 1.0), torch.full((2, 5, HEADS, DIM), 2.0)],
                   dim=1)
    side._capture = _Capture(torch.arange(10), [kv] * LAYERS)
    side.finish_save(StepPlan(captures=[CaptureOp("r1", [0], [Span(A, 0, 5)]),
                                        CaptureOp("r2", [1], [Span(A, 0, 5)])]))
    entry = side.tiers.pool.get(A)
    assert entry is not None and len(side.tiers.pool) == 1
    keys, _ = side.tiers.device.gather(torch.from_numpy(entry.rows))
    assert torch.all(keys == 2.0)
    assert side.tiers.device.free_rows == 30 - 5  # the first copy's rows were given back


def test_an_incomplete_capture_step_keeps_no_old_copy_of_its_facts() -> None:
    # A step whose capture missed a layer stores nothing. The scheduler side has already
    # counted a recaptured fact's old rows as free and now expects the new text's KV, so
    # the old copy must go too: a later load then fails (vLLM recomputes the fact) instead
    # of injecting the old text's KV under the new text's tokens.
    side = worker(30)
    capture(side, A, 10, 1.0)
    capture(side, B, 5, 4.0)
    side._capture = _Capture(torch.arange(10), [torch.full((2, 10, HEADS, DIM), 2.0), None])
    side.finish_save(StepPlan(captures=[CaptureOp("r", [0], [Span(A, 0, 10)])]))
    assert A not in side.tiers.pool and B in side.tiers.pool
    assert side.tiers.device is not None and side.tiers.device.free_rows == 30 - 5


C, D = FactKey("alice", "c"), FactKey("alice", "d")


def full_host_tier() -> WorkerSide:
    """A worker whose host tier is full with B (least recently used) and A; C, on the
    device, is about to be demoted."""
    side = worker(30)
    side.tiers.host = KVSlab(LAYERS, HEADS, DIM, torch.float32, "cpu", capacity=20,
                             max_capacity=20)
    capture(side, A, 10, 1.0)
    capture(side, B, 10, 2.0)
    side.tiers.demote(B)
    side.tiers.demote(A)
    capture(side, C, 10, 3.0)
    return side


def test_deleted_facts_give_their_rows_back_before_the_steps_moves() -> None:
    # The scheduler side counts a deleted fact's rows as free at once and may hand them
    # to a demotion or promotion of the same step, which the worker runs before the
    # step's loads; deleted facts that no load of the step reads must go first. They went
    # after the loads: the host tier was full and dropped another fact.
    side = full_host_tier()
    side.start_load(StepPlan(evicts=[A], moves=[(DEMOTE, C)]))  # A deleted, C demoted
    assert A not in side.tiers.host_pool and B in side.tiers.host_pool and C in side.tiers.host_pool


def test_a_recaptured_facts_host_copy_is_given_back_before_the_steps_moves() -> None:
    # The scheduler side forgets a fact's old KV (both tiers) when it emits its
    # recapture, and may give the rows to a demotion of the same step.
    side = full_host_tier()
    plan = StepPlan(captures=[CaptureOp("r", [0], [Span(A, 0, 10)])], moves=[(DEMOTE, C)])
    side.start_load(plan)  # A is being recaptured; C goes to the host
    assert B in side.tiers.host_pool and C in side.tiers.host_pool and A not in side.tiers.host_pool


def test_a_full_slab_leaves_the_new_fact_out_rather_than_choose_a_victim() -> None:
    # The scheduler side's registry is the one eviction policy: it makes room before a
    # capture and sends every drop in the step plan. A worker that still finds no room
    # (it would hold a fact the registry no longer counts) stores nothing; its load fails
    # later and the scheduler side forgets the fact. It used to drop its own least
    # recently used fact instead, one that the registry still listed.
    side = worker(30)
    capture(side, A, 20, 1.0)
    capture(side, B, 10, 2.0)
    capture(side, C, 5, 3.0)  # the plan made no room for C
    assert A in side.tiers.pool and B in side.tiers.pool and C not in side.tiers.pool


def test_a_failed_promotion_leaves_the_host_tier_that_the_registry_describes() -> None:
    # A promotion that finds no room on the device keeps its fact on the host and moves
    # nothing (the registry once demoted and dropped other facts for it all the same,
    # and the worker, replaying a demotion into a full host tier, dropped the very fact
    # the registry kept there).
    registry = FactRegistry(budget_tokens=20, host_budget_tokens=10)
    side = worker(20)
    side.tiers.host = KVSlab(LAYERS, HEADS, DIM, torch.float32, "cpu", capacity=10,
                             max_capacity=10)
    for key, tokens in ((A, 10), (B, 8), (C, 2)):
        registry.register(key, Registered(b"", tokens))
        capture(side, key, tokens, 1.0)
    room = registry.reserve(10)  # a capture of D: A goes to the host
    side.start_load(StepPlan(moves=list(room.moves)))
    capture(side, D, 10, 2.0)
    registry.pin([A, B])  # a request loads B and A
    room = registry.promote(A)
    assert room == Room(False)
    side.start_load(StepPlan(moves=list(room.moves)))
    assert registry.is_on_host(A) and A in side.tiers.host_pool
    assert C in side.tiers.pool and C not in side.tiers.host_pool


# -- the load step's index arrays ------------------------------------------------------


def reference_batch(side: WorkerSide, loads: list[LoadOp]) -> tuple[list[list[int]], set[int]]:
    """Rows, deltas and slots of every token loaded, one token at a time; and the cache
    blocks of pieces whose fact the pool lacks."""
    columns: list[list[int]] = [[], [], []]
    errors: set[int] = set()
    size = side._block_size
    for op in loads:
        for key, offset, length, position in op.pieces:
            entry = side.tiers.pool.get(key)
            if entry is None or offset + length > entry.num_tokens:
                errors.update(blocks_of(op.block_ids, size, position, length))
                continue
            for t in range(length):
                columns[0].append(int(entry.rows[offset + t]))
                columns[1].append(position - (entry.start + offset))
                p = position + t
                columns[2].append(op.block_ids[p // size] * size + p % size)
    return columns, errors


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_load_batch_holds_every_token_of_every_piece(data: st.DataObject) -> None:
    # Whole pieces, cut pieces (a prefix-cache hit inside a fact), facts the pool lacks
    # (their blocks are reported for a recompute), several requests with their own block
    # tables: the vectorised arrays equal the token-by-token reference.
    side = worker(1)
    keys = [FactKey("alice", str(i)) for i in range(6)]
    for i, key in enumerate(keys[:4]):  # keys 4 and 5 are not in the pool
        tokens = data.draw(st.integers(1, 40))
        side.tiers.pool.put(key, PoolEntry(np.arange(100 * i, 100 * i + tokens), data.draw(
            st.integers(0, 60)), 0))
    loads = []
    for r in range(data.draw(st.integers(1, 3))):
        pieces, position = [], data.draw(st.integers(0, 20))
        for _ in range(data.draw(st.integers(0, 5))):
            key = data.draw(st.sampled_from(keys))
            entry = side.tiers.pool.get(key)
            held = entry.num_tokens if entry is not None else 8
            offset = data.draw(st.integers(0, held - 1))
            length = data.draw(st.integers(1, held - offset + 1))  # one too many: refused
            pieces.append((key, offset, length, position))
            position += length
        blocks = data.draw(st.permutations(range(100 * r, 100 * r + position // 16 + 1)))
        loads.append(LoadOp(f"r{r}", list(blocks), pieces))
    batch = side._load_batch(loads)
    expected, errors = reference_batch(side, loads)
    assert side.take_load_errors() == errors
    if batch is None:
        assert expected == [[], [], []]
    else:
        assert batch.tolist() == expected

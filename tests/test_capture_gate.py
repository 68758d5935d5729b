"""The capture gate without a model: captures go while their tokens in flight fit the
budget, the rest wait in arrival order, a capture over the budget goes alone, and a
cancelled capture gives its place or its tokens back."""

from __future__ import annotations

import asyncio
import doctest

import pytest
from fact_kv_helpers import BUILDER, HashEmbedder, HeldRuntime

from inferscale_memory import capture_gate
from inferscale_memory.capture_gate import CaptureGate, capture_budget
from inferscale_memory.config import MemoryConfig
from inferscale_memory.fact_kv import FactKV
from inferscale_memory.memory import EngineMemory
from inferscale_memory.results import KVStats
from inferscale_memory.store import MemoryStore


def test_doctests() -> None:
    assert doctest.testmod(capture_gate).failed == 0


class Captures:
    """Captures that hold the gate until the test finishes them, in any order."""

    def __init__(self, gate: CaptureGate) -> None:
        self.gate = gate
        self.running: list[str] = []
        self.done: dict[str, asyncio.Event] = {}

    def start(self, name: str, tokens: int) -> asyncio.Task[None]:
        self.done[name] = asyncio.Event()

        async def capture() -> None:
            async with self.gate.hold(tokens):
                self.running.append(name)
                await self.done[name].wait()
                self.running.remove(name)

        return asyncio.ensure_future(capture())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_captures_go_while_they_fit_and_the_rest_wait_in_order() -> None:
    gate = CaptureGate(100)
    captures = Captures(gate)
    tasks = [captures.start(name, tokens) for name, tokens in
             [("a", 60), ("b", 40), ("c", 30), ("d", 10), ("e", 70)]]
    await settle()
    assert captures.running == ["a", "b"] and gate.in_flight == 100 and gate.waiting == 3
    captures.done["a"].set()
    await settle()
    # c and d fit now; e (70) would not beside b, c and d (80), and nothing overtakes it.
    assert captures.running == ["b", "c", "d"] and gate.in_flight == 80
    captures.done["b"].set()
    await settle()
    assert captures.running == ["c", "d"] and gate.waiting == 1  # 40 + 70 > 100
    captures.done["c"].set()
    captures.done["d"].set()
    await settle()
    assert captures.running == ["e"]
    captures.done["e"].set()
    await asyncio.gather(*tasks)
    assert gate.in_flight == 0 and gate.waiting == 0


async def test_a_capture_over_the_budget_goes_alone() -> None:
    gate = CaptureGate(100)
    captures = Captures(gate)
    small = captures.start("small", 10)
    await settle()
    big = captures.start("big", 500)
    later = captures.start("later", 10)  # behind the big one: no overtaking
    await settle()
    assert captures.running == ["small"]
    captures.done["small"].set()
    await settle()
    assert captures.running == ["big"] and gate.in_flight == 500
    captures.done["big"].set()
    await settle()
    assert captures.running == ["later"]
    captures.done["later"].set()
    await asyncio.gather(small, big, later)


async def test_a_cancelled_capture_gives_back_its_place_or_its_tokens() -> None:
    gate = CaptureGate(100)
    captures = Captures(gate)
    first = captures.start("first", 90)
    await settle()
    waiting = captures.start("waiting", 50)
    behind = captures.start("behind", 10)
    await settle()
    assert captures.running == ["first"] and gate.waiting == 2
    waiting.cancel()  # its place goes to the one behind it, which fits beside the first
    await settle()
    assert captures.running == ["first", "behind"] and gate.in_flight == 100
    first.cancel()  # a running capture's tokens come back
    captures.done["behind"].set()
    await asyncio.gather(first, waiting, behind, return_exceptions=True)
    assert gate.in_flight == 0 and gate.waiting == 0


async def test_no_budget_lets_every_capture_go_at_once() -> None:
    gate = CaptureGate(None)
    captures = Captures(gate)
    tasks = [captures.start(str(i), 10_000) for i in range(20)]
    await settle()
    assert len(captures.running) == 20
    for event in captures.done.values():
        event.set()
    await asyncio.gather(*tasks)


def test_the_budget_is_two_steps_within_half_the_pool_and_must_be_positive() -> None:
    assert capture_budget(8192) == 16_384 and capture_budget(0) == 2
    assert capture_budget(8192, pool_room=10**6) == 16_384  # an ample pool: two steps
    assert capture_budget(8192, pool_room=100) == 50  # a small one: half its free rows
    assert capture_budget(8192, pool_room=1) == 1
    with pytest.raises(ValueError, match="budget_tokens"):
        CaptureGate(0)


async def test_a_big_add_asks_the_engine_for_at_most_the_budget_at_once() -> None:
    """Through the real memory API and fact-KV owner (vLLM's runtime a stand-in that holds
    every capture): 10 facts of 4 computed tokens each, a budget of 20 tokens."""
    with MemoryStore(":memory:", HashEmbedder()) as store:
        runtime = HeldRuntime()
        memory = EngineMemory(store, FactKV(runtime, BUILDER, KVStats(), CaptureGate(20)),
                              MemoryConfig(capture_context=0))
        facts = store.add([f"fact {i}" for i in range(10)], user_id="u")
        added = asyncio.ensure_future(memory.capture("u", facts))
        await settle()
        assert runtime.captured == [f.id for f in facts[:5]]  # in the order of the add
        runtime.gate.set()
        await added
        assert runtime.captured == [f.id for f in facts]

"""Background recaptures of facts an answer found missing, without a model: the engine's
vLLM runtime (the edge) is a stand-in that holds each capture request until the test lets
it go; the store, its neighbours, the fact KV owner and the memory API are the real ones.
"""

from __future__ import annotations

import asyncio

import pytest
from fact_kv_helpers import BUILDER, HashEmbedder, HeldRuntime

from inferscale_memory import memory as memory_module
from inferscale_memory.config import MemoryConfig
from inferscale_memory.connector.report import ConnectorReport
from inferscale_memory.fact_kv import FactKV
from inferscale_memory.memory import EngineMemory
from inferscale_memory.results import KVStats
from inferscale_memory.store import Fact, MemoryStore


@pytest.fixture
def memory():
    with MemoryStore(":memory:", HashEmbedder()) as store:
        runtime = HeldRuntime()
        yield EngineMemory(store, FactKV(runtime, BUILDER, KVStats()),
                           MemoryConfig(capture_context=2)), runtime


async def test_answers_missing_the_same_fact_at_once_recapture_it_once(memory) -> None:
    engine_memory, runtime = memory
    facts = engine_memory.store.add([f"fact {i}" for i in range(5)], user_id="u")
    missing = {facts[1].id, facts[3].id}
    first = asyncio.ensure_future(engine_memory.recapture("u", facts, missing))
    while len(runtime.captured) < 2:
        await asyncio.sleep(0)
    others = [asyncio.ensure_future(engine_memory.recapture("u", facts, missing))
              for _ in range(3)]
    # Nothing of theirs waits for the engine: both facts are under way. (The bound only
    # keeps a regression, whose recaptures would wait behind the gate, from hanging.)
    done, _ = await asyncio.wait(others, timeout=30)
    assert len(done) == len(others)
    assert sorted(runtime.captured) == sorted(missing)
    runtime.gate.set()
    await first
    # Done: a later answer that misses them again recaptures them again.
    await engine_memory.recapture("u", facts, {facts[1].id})
    assert runtime.captured.count(facts[1].id) == 2


async def test_recaptures_under_way_are_bounded_and_a_failed_one_is_asked_again(
        memory, monkeypatch) -> None:
    engine_memory, runtime = memory
    monkeypatch.setattr(memory_module, "MAX_RECAPTURING", 3)
    facts = engine_memory.store.add([f"fact {i}" for i in range(6)], user_id="u")
    held = asyncio.ensure_future(
        engine_memory.recapture("u", facts, {f.id for f in facts}))
    while len(runtime.captured) < 3:
        await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(runtime.captured) == 3  # the other 3 are left to a later answer
    runtime.gate.set()
    await held

    async def fails(*args: object) -> ConnectorReport:
        raise RuntimeError("engine went away")

    monkeypatch.setattr(runtime, "control", fails)
    foreign = Fact("f" * 32, "v", "a fact of another store", {}, 0.0, 0.0)
    with pytest.raises(RuntimeError):
        await engine_memory.recapture("v", [foreign], {foreign.id})
    monkeypatch.undo()
    runtime.captured.clear()
    await engine_memory.recapture("v", [foreign], {foreign.id})
    assert runtime.captured == [foreign.id]  # the failed one was not left "under way"

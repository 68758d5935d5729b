"""Partial failures on the real engine: a fact stored whose capture failed, a stream
abandoned by its caller. Each leaves the store and the engine as a user would expect."""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_engine import ask

from inferscale_memory import EngineError, MemoryEngine

pytestmark = pytest.mark.engine


def test_add_returns_the_stored_fact_when_its_capture_fails(
        engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # The fact is the truth and its KV a cache: once the fact is committed, a failed
    # capture must not turn the add into an error (a retry would store it twice). The
    # first answer that needs the fact computes it and recaptures it.
    control = engine.runtime.control

    async def failing_capture(token_ids: list[int], params: Any) -> dict[str, Any]:
        if params.capture and any(span.key.ns for span in params.capture):
            raise EngineError("capture failed")
        return await control(token_ids, params)

    monkeypatch.setattr(engine.runtime, "control", failing_capture)
    fact = engine.memory.add("Tove keeps bees on the roof.", user_id="partial-add")
    assert [f.id for f in engine.memory.list(user_id="partial-add")] == [fact.id]
    assert "capture failed" in caplog.text
    monkeypatch.setattr(engine.runtime, "control", control)
    first = engine.chat(ask("What does Tove keep?"), user_id="partial-add", k=1, max_tokens=2)
    assert first.metrics.recomputed_fact_ids == [fact.id]
    engine.wait_for_background()
    again = engine.chat(ask("What does Tove keep?"), user_id="partial-add", k=1, max_tokens=2)
    assert again.metrics.injected_fact_ids == [fact.id]


def test_a_stream_stopped_early_aborts_its_request(engine: MemoryEngine) -> None:
    engine.memory.add("Ulla writes long letters.", user_id="partial-stream")
    stream = engine.stream_chat(ask("Write Ulla a long letter."), user_id="partial-stream",
                                max_tokens=2000, ignore_eos=True)
    next(stream)
    assert engine.runtime.unfinished_requests() == 1
    stream.close()
    # Closed on the engine loop: vLLM aborts the request instead of generating 2,000
    # tokens for nobody.
    deadline = time.monotonic() + 5
    while engine.runtime.unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.runtime.unfinished_requests() == 0

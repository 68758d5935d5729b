"""The soak script's clients keep to the API's contract, so a clean run reports 0 errors."""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine


def _soak() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "soak.py"
    spec = importlib.util.spec_from_file_location("soak", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _seed_whose_first_op_is(soak: ModuleType, op: str) -> int:
    for seed in range(1000):
        rng = random.Random(seed)
        if rng.choices(list(soak.OPS), weights=list(soak.OPS.values()))[0] == op:
            return seed
    raise AssertionError(f"no seed draws {op} first")


def test_a_client_whose_first_draw_is_a_search_adds_first(engine: MemoryEngine) -> None:
    # A user that never stored a fact is an unknown user (a typed error, HTTP 404), so a
    # client must not search or chat before its first add; the soak once counted that as
    # a server error.
    soak = _soak()
    seed = _seed_whose_first_op_is(soak, "search")
    recorder = soak.Recorder()
    user = f"soak-test-{seed}"
    soak.client_loop(
        soak.PythonTarget(engine), user, seed, time.monotonic() + 2, recorder, max_tokens=2
    )
    assert recorder.calls, "the client made no call"
    assert [c for c in recorder.calls if c[3] is not None] == []
    assert recorder.calls[0][1] == "add"
    assert engine.memory.list(user_id=user)

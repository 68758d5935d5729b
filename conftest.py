"""Shared fixtures: one real vLLM engine with the embedded default model per session.

Starting the engine takes about a minute on a 2-core CPU, so every engine test (``tests/``
and the framework adapters' tests under ``adapters/``) shares it and works with its own
user ids. This file sits at the root so that both trees see the same fixture.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def engine_store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine") / "memory.sqlite"


@pytest.fixture(scope="session")
def engine(engine_store_path: Path) -> Iterator[MemoryEngine]:
    from inferscale_memory import MemoryEngine

    kv_cache_gb = int(os.environ.get("INFERSCALE_TEST_KV_CACHE_GB", "2"))
    # Pure injection (no recomputed tail, each fact captured right after the header): the
    # tests check the connector's mechanics fact by fact. The default quality policy is
    # switched on where it is under test (tests/test_engine_quality.py).
    with MemoryEngine(store_path=str(engine_store_path), kv_cache_gb=kv_cache_gb,
                      max_model_len=4096, recompute_tail=0, capture_context=0) as shared:
        yield shared


@pytest.fixture(scope="session")
def block_fact(engine: MemoryEngine) -> Callable[[str], str]:
    """Pads a sentence so that header + fact fill exactly one KV block.

    The text path then finds header + fact in vLLM's prefix cache (after a warm-up call),
    so it computes the rest of the prompt in the same chunk as the KV path, and greedy
    answers of the two paths are token-identical (see ``tests/test_engine.py``).
    """
    target = engine.runtime.block_size - len(engine.builder.header_ids)
    filler = ["and", "she", "keeps", "a", "small", "notebook", "about", "it"]

    def pad(sentence: str) -> str:
        words = sentence.rstrip(".").split()
        for extra in range(400):
            for oks in range(4):
                text = " ".join(words + (filler * 60)[:extra]) + " ok" * oks + "."
                if len(engine.builder.fact_ids(text)) == target:
                    return text
        raise AssertionError("no padding reaches the block boundary")

    return pad


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random-weight model folder with a tokenizer and Qwen2.5's tool chat template
    (``tests/tool_model.py``). With ``enforce_eager=True`` an engine on it starts in seconds
    (SmolLM2 with torch.compile: 1-3 minutes on 2 CPU cores), so tests of the engine's
    lifecycle (start, shutdown, restart, processes, budgets) use it; its answers are noise.
    """
    # By path: the adapters' own ``tests`` packages shadow ours as an import name.
    spec = importlib.util.spec_from_file_location(
        "tool_model", Path(__file__).parent / "tests" / "tool_model.py")
    assert spec is not None and spec.loader is not None
    tool_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool_model)
    folder: Path = tool_model.write_tool_model(
        tmp_path_factory.mktemp("tool-model") / "qwen-template-tiny")
    return folder


@pytest.fixture(scope="session")
def tool_engine(tiny_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryEngine]:
    """An engine on the tiny model with Qwen2.5's tool chat template, for the mechanics of
    tools and structured output."""
    from inferscale_memory import MemoryEngine

    store = tmp_path_factory.mktemp("tool-store") / "memory.sqlite"
    with MemoryEngine(str(tiny_model), store_path=str(store), kv_cache_gb=1,
                      max_model_len=2048, recompute_tail=0, capture_context=0,
                      enforce_eager=True) as shared:
        yield shared

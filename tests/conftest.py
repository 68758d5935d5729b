"""Fixtures of ``tests/`` beside the root conftest's shared engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine


@pytest.fixture(scope="session")
def tool_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryEngine]:
    """An engine on a small random-weight model with Qwen2.5's tool chat template
    (``tests/tool_model.py``), for the mechanics of tools and structured output."""
    from tool_model import write_tool_model

    from inferscale_memory import MemoryEngine

    folder = write_tool_model(tmp_path_factory.mktemp("tool-model") / "qwen-template-tiny")
    store = tmp_path_factory.mktemp("tool-store") / "memory.sqlite"
    with MemoryEngine(str(folder), store_path=str(store), kv_cache_gb=1, max_model_len=2048,
                      recompute_tail=0, capture_context=0) as shared:
        yield shared

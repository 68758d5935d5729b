"""Shared fixtures: one real vLLM engine with the embedded default model per session.

Starting the engine takes about a minute on a 2-core CPU, so every engine test shares it
and works with its own user ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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
    with MemoryEngine(store_path=str(engine_store_path), kv_cache_gb=kv_cache_gb,
                      max_model_len=4096) as shared:
        yield shared

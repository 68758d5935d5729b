"""Fixtures of ``tests/`` beside the root conftest's shared engine: one real PostgreSQL
(with pgvector) per session and a database per test, and an engine with a tool template.

The PostgreSQL server comes from the PyPI package ``pgserver`` (see ``pg_helpers.py``);
tests that ask for it are skipped when the ``postgres`` test dependencies are not installed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pg_helpers import HAS_POSTGRES, new_database

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The URL of a PostgreSQL server that this session started (stopped at its end)."""
    if not HAS_POSTGRES:
        pytest.skip("needs pgserver, psycopg, psycopg-pool and pgvector")
    import pgserver

    with tempfile.TemporaryDirectory(prefix="inferscale-pg-") as folder:
        server = pgserver.get_server(folder, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


@pytest.fixture
def pg_url(pg_server: str) -> str:
    """A new, empty database of its own for one test."""
    return new_database(pg_server)


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

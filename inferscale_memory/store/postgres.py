"""PostgreSQL persistence of the fact store, for facts shared by several engine replicas.

:class:`PostgresFactDB` has the contract of :class:`~inferscale_memory.store.sqlite.FactDB`
(the same tables: ``facts``, ``history``, ``users``, ``meta``), through psycopg 3 and its
connection pool; embeddings are pgvector ``vector`` columns. :class:`PgVectorIndex`
searches them in SQL (exact, or HNSW with ``hnsw=True``), the tenant filter in the
``WHERE`` clause, so every replica sees a fact the moment its add commits.

The schema is created and migrated by the store: ``schema_version`` holds the version,
raised one migration at a time under an advisory lock (replicas that open at once do not
race). Needs the ``postgres`` extra: ``pip install 'inferscale-memory[postgres]'``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from inferscale_memory.errors import MissingDependencyError, StoreError
from inferscale_memory.store.facts import Fact
from inferscale_memory.store.index import VectorIndex, check_query

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
URL_SCHEMES = ("postgresql://", "postgres://")
_MIGRATE_LOCK = 0x1F5_7A6E  # pg_advisory_xact_lock key of the schema migration

# _MIGRATIONS[v] brings a store from version v-1 to version v.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE facts (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            text TEXT NOT NULL,
            metadata JSONB NOT NULL,
            embedding vector NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX facts_by_user ON facts (user_id, created_at, id)",
        """CREATE TABLE history (
            seq BIGSERIAL PRIMARY KEY,
            fact_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            event TEXT NOT NULL CHECK (event IN ('ADD', 'UPDATE', 'DELETE')),
            old_text TEXT,
            new_text TEXT,
            at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX history_by_fact ON history (fact_id, seq)",
        "CREATE TABLE users (user_id TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ),
}

_FACT_COLS = "id, user_id, text, metadata, created_at, updated_at"


def is_postgres_url(value: Any) -> bool:
    """Whether ``value`` names a PostgreSQL database (``postgresql://...``)."""
    return isinstance(value, str) and value.startswith(URL_SCHEMES)


def redact(url: str) -> str:
    """``url`` without its password, for logs and error messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _to_fact(row: Sequence[Any]) -> Fact:
    # JSONB gives dicts back already; a copy through json keeps them plain JSON values.
    return Fact(row[0], row[1], row[2], json.loads(json.dumps(row[3])), row[4], row[5])


def _vec(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype=np.float32)


def _imports() -> tuple[Any, Any, Any, Any]:
    try:
        import psycopg
        from pgvector.psycopg import register_vector
        from psycopg.types.json import Jsonb
        from psycopg_pool import ConnectionPool
    except ImportError as exc:
        raise MissingDependencyError(
            "store='postgres' needs psycopg, psycopg-pool and pgvector: "
            "pip install 'inferscale-memory[postgres]'"
        ) from exc
    return psycopg, register_vector, Jsonb, ConnectionPool


class PgTx:
    """The write operations of one open transaction (see :meth:`PostgresFactDB.transaction`)."""

    def __init__(self, conn: Any, jsonb: Any) -> None:
        self._conn = conn
        self._jsonb = jsonb

    def _history(self, fact: Fact, event: str, old: str | None, new: str | None, at: float) -> None:
        self._conn.execute(
            "INSERT INTO history (fact_id, user_id, event, old_text, new_text, at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (fact.id, fact.user_id, event, old, new, at),
        )

    def get(self, fact_id: str, user_id: str) -> Fact | None:
        """Return the fact if it is ``user_id``'s, locked until the transaction ends (so
        two replicas that change one fact at once take turns), or ``None``."""
        row = self._conn.execute(
            f"SELECT {_FACT_COLS} FROM facts WHERE id = %s AND user_id = %s FOR UPDATE",
            (fact_id, user_id),
        ).fetchone()
        return None if row is None else _to_fact(row)

    def insert(self, facts: Sequence[Fact], embeddings: np.ndarray) -> None:
        """Insert new facts with their embeddings, register their users, log ADD."""
        for fact, vec in zip(facts, embeddings, strict=True):
            self._conn.execute(
                f"INSERT INTO facts ({_FACT_COLS}, embedding)"
                " VALUES (%s, %s, %s, %s, %s, %s, %b)",
                (fact.id, fact.user_id, fact.text, self._jsonb(fact.metadata),
                 fact.created_at, fact.updated_at, _vec(vec)),
            )
            self._conn.execute(
                "INSERT INTO users (user_id, created_at) VALUES (%s, %s)"
                " ON CONFLICT (user_id) DO NOTHING",
                (fact.user_id, fact.created_at),
            )
            self._history(fact, "ADD", None, fact.text, fact.created_at)

    def update(self, old: Fact, new: Fact, embedding: np.ndarray) -> None:
        """Replace a fact's text, metadata and embedding; log UPDATE."""
        self._conn.execute(
            "UPDATE facts SET text = %s, metadata = %s, embedding = %b, updated_at = %s"
            " WHERE id = %s",
            (new.text, self._jsonb(new.metadata), _vec(embedding), new.updated_at, new.id),
        )
        self._history(new, "UPDATE", old.text, new.text, new.updated_at)

    def delete(self, fact: Fact, at: float) -> None:
        """Delete one fact; log DELETE."""
        self._conn.execute("DELETE FROM facts WHERE id = %s", (fact.id,))
        self._history(fact, "DELETE", fact.text, None, at)

    def delete_user_facts(self, user_id: str, at: float) -> list[Fact]:
        """Delete every fact of a user (the user stays known); log DELETE for each."""
        rows = self._conn.execute(
            f"DELETE FROM facts WHERE user_id = %s RETURNING {_FACT_COLS}", (user_id,)
        ).fetchall()
        facts = sorted((_to_fact(r) for r in rows), key=lambda f: (f.created_at, f.id))
        for fact in facts:
            self._history(fact, "DELETE", fact.text, None, at)
        return facts

    def set_meta(self, key: str, value: str) -> None:
        """Set one key of the ``meta`` table."""
        self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (%s, %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


class PostgresFactDB:
    """A PostgreSQL database holding one fact store (needs the pgvector extension).

    Args:
        url: A libpq URL, e.g. ``"postgresql://user:secret@db:5432/memory"``.
        pool_size: Most connections this process keeps open.

    Raises:
        MissingDependencyError: psycopg, psycopg-pool or pgvector is not installed.
        StoreError: The server cannot be reached, has no pgvector, or holds a newer schema.
    """

    def __init__(self, url: str, pool_size: int = 4) -> None:
        psycopg, register_vector, self._jsonb, pool_cls = _imports()
        self.path = redact(url)
        self._lock = threading.RLock()
        self._pool: Any = None
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                self._migrate(conn)
            self._pool = pool_cls(url, min_size=1, max_size=pool_size, open=True, timeout=30.0,
                                  kwargs={"autocommit": True}, configure=register_vector)
        except psycopg.Error as exc:
            raise StoreError(
                f"{self.path} cannot be opened as a fact store ({exc}); check postgres_url, "
                "that the server runs and that it has the pgvector extension"
            ) from exc

    def _migrate(self, conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            version = 0 if row is None else row[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, newer than this "
                    f"inferscale-memory understands ({SCHEMA_VERSION}); upgrade inferscale-memory"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                logger.info("Migrating fact store %s to schema %d", self.path, target)
                for statement in _MIGRATIONS[target]:
                    conn.execute(statement)
            if version < SCHEMA_VERSION:
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION,))

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Any]:
        if self._pool is None:
            raise StoreError(f"the fact store {self.path} is closed; open a new MemoryStore")
        with self._pool.connection() as conn:
            yield conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgTx]:
        """Run writes as one transaction: committed (durably) on exit, rolled back on error."""
        with self._lock, self._conn() as conn, conn.transaction():
            yield PgTx(conn, self._jsonb)

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._conn() as conn:
            return conn.execute(sql, args, binary=True).fetchall()

    def get(self, fact_id: str, user_id: str) -> Fact | None:
        """Return the fact if it is ``user_id``'s, or ``None`` (one query for both misses)."""
        rows = self._all(f"SELECT {_FACT_COLS} FROM facts WHERE id = %s AND user_id = %s",
                         (fact_id, user_id))
        return _to_fact(rows[0]) if rows else None

    def get_many(self, user_id: str, ids: Sequence[str]) -> dict[str, Fact]:
        """Return the facts of ``user_id`` among ``ids``, keyed by id."""
        rows = self._all(f"SELECT {_FACT_COLS} FROM facts WHERE user_id = %s AND id = ANY(%s)",
                         (user_id, list(ids)))
        return {r[0]: _to_fact(r) for r in rows}

    def list_user(self, user_id: str) -> list[Fact]:
        """Return a user's facts ordered by ``(created_at, id)``."""
        rows = self._all(
            f"SELECT {_FACT_COLS} FROM facts WHERE user_id = %s ORDER BY created_at, id",
            (user_id,),
        )
        return [_to_fact(r) for r in rows]

    def embedding_matrix(self, user_id: str, dim: int) -> tuple[list[str], np.ndarray]:
        """Return a user's fact ids and their embeddings as a ``(n, dim)`` float32 array.

        Raises:
            StoreError: An embedding of another size than ``dim``.
        """
        rows = self._all("SELECT id, embedding FROM facts WHERE user_id = %s ORDER BY id",
                         (user_id,))
        vectors = [r[1].to_numpy() for r in rows]
        if any(v.shape != (dim,) for v in vectors):
            raise StoreError(f"{self.path} has an embedding of the wrong size for {user_id!r}")
        matrix = np.stack(vectors) if vectors else np.zeros((0, dim), np.float32)
        return [r[0] for r in rows], matrix.astype(np.float32, copy=False)

    def users(self) -> list[str]:
        """Return every user that ever stored a fact, sorted."""
        return [r[0] for r in self._all("SELECT user_id FROM users ORDER BY user_id")]

    def counts(self) -> tuple[int, int]:
        """Return (users that ever stored a fact, facts stored now), in one query."""
        users, facts = self._all(
            "SELECT (SELECT COUNT(*) FROM users), (SELECT COUNT(*) FROM facts)")[0]
        return int(users), int(facts)

    def has_user(self, user_id: str) -> bool:
        """Whether the user ever stored a fact."""
        return bool(self._all("SELECT 1 FROM users WHERE user_id = %s", (user_id,)))

    def history(self, fact_id: str, user_id: str) -> list[dict[str, Any]]:
        """Return the events of one fact of one user, oldest first."""
        rows = self._all(
            "SELECT fact_id, user_id, event, old_text, new_text, at FROM history"
            " WHERE fact_id = %s AND user_id = %s ORDER BY seq",
            (fact_id, user_id),
        )
        keys = ("fact_id", "user_id", "event", "old_text", "new_text", "at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def get_meta(self, key: str) -> str | None:
        """Return one key of the ``meta`` table, or ``None``."""
        rows = self._all("SELECT value FROM meta WHERE key = %s", (key,))
        return rows[0][0] if rows else None

    def last_timestamp(self) -> float:
        """Return the latest time written to the store (0.0 for an empty store)."""
        rows = self._all("SELECT MAX(at) FROM history")
        return float(rows[0][0] or 0.0)

    def search(self, user_id: str, vector: np.ndarray, k: int,
               hnsw_dim: int | None = None) -> list[tuple[str, float]]:
        """The ``k`` facts of ``user_id`` nearest ``vector`` (cosine), best first, ties by id.

        ``hnsw_dim`` searches through the HNSW index of that dimension (approximate).
        """
        column = "embedding" if hnsw_dim is None else f"(embedding::vector({int(hnsw_dim)}))"
        sql = (f"SELECT id, 1 - ({column} <=> %b) AS score FROM facts WHERE user_id = %s"
               f" ORDER BY {column} <=> %b, id LIMIT %s")
        q = _vec(vector)
        with self._conn() as conn, conn.transaction():
            if hnsw_dim is not None:
                conn.execute(self._hnsw_setting)
            rows = conn.execute(sql, (q, user_id, q, k), binary=True).fetchall()
        return [(r[0], float(r[1])) for r in rows]

    def create_hnsw(self, dim: int) -> None:
        """Create the HNSW index (cosine) over embeddings of dimension ``dim``, if missing."""
        version = self._all("SELECT extversion FROM pg_extension WHERE extname = 'vector'")[0][0]
        # The tenant filter runs after the graph walk: pgvector >= 0.8 walks on until k rows
        # pass it; older ones see at most ef_search candidates (1000, their maximum).
        modern = tuple(int(p) for p in version.split(".")[:2]) >= (0, 8)
        self._hnsw_setting = ("SET LOCAL hnsw.iterative_scan = strict_order" if modern
                              else "SET LOCAL hnsw.ef_search = 1000")
        with self._conn() as conn:
            conn.execute(f"CREATE INDEX IF NOT EXISTS facts_hnsw_{int(dim)} ON facts USING hnsw"
                         f" ((embedding::vector({int(dim)})) vector_cosine_ops)")

    def close(self) -> None:
        """Close the pool (idempotent)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


class PgVectorIndex(VectorIndex):
    """Search in the PostgreSQL store itself: the facts table is the index.

    The store's transactions already wrote the embeddings, so writes here are no-ops and
    every replica that shares the database searches the same, committed facts.

    Args:
        db: The store's database.
        dim: Embedding dimension.
        hnsw: Search through an HNSW index (approximate, created if missing) instead of an
            exact scan of the user's rows.
    """

    def __init__(self, db: PostgresFactDB, dim: int, hnsw: bool = False) -> None:
        self._db = db
        self._dim = dim
        self._hnsw = hnsw
        if hnsw:
            db.create_hnsw(dim)

    def upsert(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        """A no-op: the store's transaction wrote the vectors."""

    def remove(self, user_id: str, ids: Sequence[str]) -> None:
        """A no-op: the store's transaction deleted the rows."""

    def clear(self, user_id: str) -> None:
        """A no-op: the store's transaction deleted the rows."""

    def replace(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        """A no-op: the table is the truth already."""

    def search(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        k = check_query(vector, k)
        return self._db.search(user_id, vector, k, self._dim if self._hnsw else None)

    def count(self, user_id: str) -> int:
        return int(self._db._all("SELECT COUNT(*) FROM facts WHERE user_id = %s",
                                 (user_id,))[0][0])

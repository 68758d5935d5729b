"""PostgreSQL persistence of the fact store, for facts shared by several engine replicas.

:class:`PostgresFactDB` has the contract of :class:`~inferscale_memory.store.sqlite.FactDB`
(the same tables: ``facts``, ``history``, ``users``, ``meta``), through psycopg 3 and its
connection pool; embeddings are pgvector ``vector`` columns. :class:`PgVectorIndex`
searches them in SQL (exact, or HNSW with ``hnsw=True``), the user filter in the
``WHERE`` clause, so every replica sees a fact the moment its add commits.

Texts are UTF-8 ``BYTEA`` and metadata ``JSON`` (not ``TEXT``/``JSONB``): the store accepts
any valid Unicode, NUL included, which PostgreSQL's text types refuse. The schema is
created and migrated by the store: ``schema_version`` holds the version, raised one
migration at a time under an advisory lock (replicas that open at once do not race).
Needs the ``postgres`` extra: ``pip install 'inferscale-memory[postgres]'``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from inferscale_memory.errors import MissingDependencyError, StoreError
from inferscale_memory.store._queries import FactQueries, TxWrites
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
            text BYTEA NOT NULL,
            metadata JSON NOT NULL,
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
            old_text BYTEA,
            new_text BYTEA,
            at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX history_by_fact ON history (fact_id, seq)",
        "CREATE TABLE users (user_id TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ),
}

_FACT_COLS = "id, user_id, text, metadata::text, created_at, updated_at"
_INSERT_COLS = "id, user_id, text, metadata, created_at, updated_at"


def is_postgres_url(value: Any) -> bool:
    """Whether ``value`` names a PostgreSQL database (``postgresql://...``)."""
    return isinstance(value, str) and value.startswith(URL_SCHEMES)


def redact(url: str) -> str:
    """``url`` without its password, for logs and error messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _to_fact(row: Sequence[Any]) -> Fact:
    return Fact(row[0], row[1], _text(row[2]) or "", json.loads(row[3]), row[4], row[5])


def _text(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).decode("utf-8")


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else value.encode("utf-8")


def _storable(fact_id: str) -> bool:
    """Whether a fact id can be sent at all: ids are hex, and PostgreSQL's text refuses NUL
    (an id holding one names no fact, as an unknown id does)."""
    return "\x00" not in fact_id


def _vec(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype=np.float32)


def _imports() -> tuple[Any, Any, Any]:
    try:
        import psycopg
        from pgvector.psycopg import register_vector
        from psycopg_pool import ConnectionPool
    except ImportError as exc:
        raise MissingDependencyError(
            "store='postgres' needs psycopg, psycopg-pool and pgvector: "
            "pip install 'inferscale-memory[postgres]'"
        ) from exc
    return psycopg, register_vector, ConnectionPool


def _configure(register_vector: Any, conn: Any) -> None:
    """Set up a new pool connection: the vector type, and commits that wait for the disk
    (whatever the server's default: an acknowledged write must survive a crash of it)."""
    register_vector(conn)
    conn.execute("SET synchronous_commit = on")


class PgTx(TxWrites):
    """The write operations of one open transaction (see :meth:`PostgresFactDB.transaction`)."""

    MARK = "%s"
    _text_param = staticmethod(_bytes)

    def get(self, fact_id: str, user_id: str) -> Fact | None:
        """Return the fact if it is ``user_id``'s, locked until the transaction ends (so
        two replicas that change one fact at once take turns), or ``None``."""
        if not _storable(fact_id):
            return None
        row = self._conn.execute(
            f"SELECT {_FACT_COLS} FROM facts WHERE id = %s AND user_id = %s FOR UPDATE",
            (fact_id, user_id),
        ).fetchone()
        return None if row is None else _to_fact(row)

    def insert(self, facts: Sequence[Fact], embeddings: np.ndarray) -> None:
        """Insert new facts with their embeddings, register their users, log ADD.

        Each statement goes once for the whole batch (psycopg pipelines ``executemany``),
        so a batch of n facts costs a few round trips, not 3n."""
        facts = list(facts)
        with self._conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO facts ({_INSERT_COLS}, embedding)"
                " VALUES (%s, %s, %s, %s, %s, %s, %b)",
                [(f.id, f.user_id, _bytes(f.text), json.dumps(f.metadata), f.created_at,
                  f.updated_at, _vec(vec)) for f, vec in zip(facts, embeddings, strict=True)],
            )
            cur.executemany(
                "INSERT INTO users (user_id, created_at) VALUES (%s, %s)"
                " ON CONFLICT (user_id) DO NOTHING",
                sorted({f.user_id: (f.user_id, f.created_at) for f in facts[::-1]}.values()),
            )
            cur.executemany(
                "INSERT INTO history (fact_id, user_id, event, old_text, new_text, at)"
                " VALUES (%s, %s, 'ADD', NULL, %s, %s)",
                [(f.id, f.user_id, _bytes(f.text), f.created_at) for f in facts],
            )

    def update(self, old: Fact, new: Fact, embedding: np.ndarray) -> None:
        """Replace a fact's text, metadata and embedding; log UPDATE."""
        self._conn.execute(
            "UPDATE facts SET text = %s, metadata = %s, embedding = %b, updated_at = %s"
            " WHERE id = %s",
            (_bytes(new.text), json.dumps(new.metadata), _vec(embedding), new.updated_at,
             new.id),
        )
        self._history(new, "UPDATE", old.text, new.text, new.updated_at)

    def delete_user_facts(self, user_id: str, at: float) -> list[Fact]:
        """Delete every fact of a user (the user stays known); log DELETE for each."""
        rows = self._conn.execute(
            f"DELETE FROM facts WHERE user_id = %s RETURNING {_FACT_COLS}", (user_id,)
        ).fetchall()
        facts = sorted((_to_fact(r) for r in rows), key=lambda f: (f.created_at, f.id))
        for fact in facts:
            self._history(fact, "DELETE", fact.text, None, at)
        return facts


class PostgresFactDB(FactQueries):
    """A PostgreSQL database holding one fact store (needs the pgvector extension).

    Args:
        url: A libpq URL, e.g. ``"postgresql://user:secret@db:5432/memory"``.
        pool_size: Most connections this process keeps open.

    Raises:
        MissingDependencyError: psycopg, psycopg-pool or pgvector is not installed.
        StoreError: The server cannot be reached, has no pgvector, or holds a newer schema.
    """

    MARK = "%s"
    FACT_COLS = _FACT_COLS
    _to_fact = staticmethod(_to_fact)

    def __init__(self, url: str, pool_size: int = 4) -> None:
        psycopg, register_vector, pool_cls = _imports()
        self.path = redact(url)
        self._lock = threading.RLock()
        self._pool: Any = None
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                self._migrate(conn)
            self._pool = pool_cls(url, min_size=1, max_size=pool_size, open=True, timeout=30.0,
                                  kwargs={"autocommit": True},
                                  configure=functools.partial(_configure, register_vector))
        except psycopg.Error as exc:
            raise StoreError(
                f"{self.path} cannot be opened as a fact store ({exc}); check postgres_url, "
                "that the server runs and that it has the pgvector extension"
            ) from exc

    def _migrate(self, conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            # Under the lock: two replicas creating it at once fail one (a duplicate key).
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
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
            yield PgTx(conn)

    @contextlib.contextmanager
    def copy(self) -> Iterator[PgCopy]:
        """One transaction of ``migrate-store`` writes (all or nothing)."""
        with self._lock, self._conn() as conn, conn.transaction():
            yield PgCopy(conn)

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._conn() as conn:
            return conn.execute(sql, args, binary=True).fetchall()

    def get(self, fact_id: str, user_id: str) -> Fact | None:
        """Return the fact if it is ``user_id``'s, or ``None`` (one query for both misses)."""
        if not _storable(fact_id):
            return None
        rows = self._all(f"SELECT {_FACT_COLS} FROM facts WHERE id = %s AND user_id = %s",
                         (fact_id, user_id))
        return _to_fact(rows[0]) if rows else None

    def get_many(self, user_id: str, ids: Sequence[str]) -> dict[str, Fact]:
        """Return the facts of ``user_id`` among ``ids``, keyed by id."""
        rows = self._all(f"SELECT {_FACT_COLS} FROM facts WHERE user_id = %s AND id = ANY(%s)",
                         (user_id, [i for i in ids if _storable(i)]))
        return {r[0]: _to_fact(r) for r in rows}

    def embeddings_of(self, user_id: str, ids: Sequence[str], dim: int) -> dict[str, np.ndarray]:
        """Return the embeddings of the facts of ``user_id`` among ``ids``, keyed by id
        (float32 rows of ``dim``; an embedding of another size is left out)."""
        rows = self._all("SELECT id, embedding FROM facts WHERE user_id = %s AND id = ANY(%s)",
                         (user_id, [i for i in ids if _storable(i)]))
        vectors = ((r[0], r[1].to_numpy().astype(np.float32, copy=False)) for r in rows)
        return {fid: v for fid, v in vectors if v.shape == (dim,)}

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

    def history(self, fact_id: str, user_id: str) -> list[dict[str, Any]]:
        """Return the events of one fact of one user, oldest first."""
        if not _storable(fact_id):
            return []
        rows = self._all(
            "SELECT fact_id, user_id, event, old_text, new_text, at FROM history"
            " WHERE fact_id = %s AND user_id = %s ORDER BY seq",
            (fact_id, user_id),
        )
        keys = ("fact_id", "user_id", "event", "old_text", "new_text", "at")
        return [dict(zip(keys, (*r[:3], _text(r[3]), _text(r[4]), r[5]), strict=True))
                for r in rows]

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
        # The user filter runs after the graph walk: pgvector >= 0.8 walks on until k rows
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

    searches_store = True  # MemoryStore loads nothing into it on open

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


class PgCopy:
    """The writes of ``migrate-store --to postgres``, in one transaction of the target
    (see :meth:`PostgresFactDB.copy`); each says whether it changed anything."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def user(self, user_id: str, created_at: float) -> None:
        self._conn.execute("INSERT INTO users (user_id, created_at) VALUES (%s, %s)"
                           " ON CONFLICT (user_id) DO NOTHING", (user_id, created_at))

    def fact(self, fact: Fact, embedding: np.ndarray) -> bool:
        """Insert the fact, or make the row with its id equal to it; True if written."""
        row = self._conn.execute(
            f"INSERT INTO facts ({_INSERT_COLS}, embedding) VALUES (%s, %s, %s, %s, %s, %s, %b)"
            " ON CONFLICT (id) DO UPDATE SET user_id = excluded.user_id, text = excluded.text,"
            " metadata = excluded.metadata, embedding = excluded.embedding,"
            " created_at = excluded.created_at, updated_at = excluded.updated_at"
            " WHERE (facts.user_id, facts.text, facts.metadata::text, facts.embedding,"
            " facts.created_at, facts.updated_at) IS DISTINCT FROM (excluded.user_id,"
            " excluded.text, excluded.metadata::text, excluded.embedding, excluded.created_at,"
            " excluded.updated_at) RETURNING id",
            (fact.id, fact.user_id, _bytes(fact.text), json.dumps(fact.metadata),
             fact.created_at, fact.updated_at, _vec(embedding)),
        ).fetchone()
        return row is not None

    def remove(self, fact_id: str) -> bool:
        """Delete a fact the source deleted; True if it was there."""
        return self._conn.execute("DELETE FROM facts WHERE id = %s RETURNING id",
                                  (fact_id,)).fetchone() is not None

    def event(self, event: dict[str, Any]) -> bool:
        """Append a history event unless an equal one (fact, kind, time) is there."""
        return self._conn.execute(
            "INSERT INTO history (fact_id, user_id, event, old_text, new_text, at)"
            " SELECT %s, %s, %s, %s, %s, %s WHERE NOT EXISTS (SELECT 1 FROM history"
            " WHERE fact_id = %s AND event = %s AND at = %s) RETURNING seq",
            (event["fact_id"], event["user_id"], event["event"], _bytes(event["old_text"]),
             _bytes(event["new_text"]), event["at"], event["fact_id"], event["event"],
             event["at"]),
        ).fetchone() is not None

    def meta(self, key: str, value: str) -> str:
        """Set ``key`` if missing; return the value the target holds."""
        self._conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s)"
                           " ON CONFLICT (key) DO NOTHING", (key, value))
        return str(self._conn.execute("SELECT value FROM meta WHERE key = %s",
                                      (key,)).fetchone()[0])

"""SQLite persistence of the fact store: the durable truth of facts and embeddings.

One connection (``check_same_thread=False``) guarded by a lock; WAL journal with
``synchronous=FULL``, so a write that returned survives a ``kill -9`` or a power cut.
Every write is one ``BEGIN IMMEDIATE`` transaction. The schema is versioned with
``PRAGMA user_version`` and migrated forward on open.

Tables: ``facts`` (one row per live fact, embedding as little-endian float32 blob),
``history`` (ADD/UPDATE/DELETE events, kept after a delete, like Mem0's history),
``users`` (every user that ever stored a fact) and ``meta`` (key/value, e.g. the
embedding dimension).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferscale_memory.errors import StoreError
from inferscale_memory.store._queries import FactQueries, TxWrites
from inferscale_memory.store.facts import Fact

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

# Facts read by id (a search's hits) are found by primary key, and their owner checked on
# the rows found: the unary + keeps SQLite from choosing the user's index instead, which
# scans every row of the user (every retrieval then cost O(facts held)).
_OWNED_BY = "+user_id = ?"

# _MIGRATIONS[v] brings a store from version v-1 to version v.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE facts (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            text TEXT NOT NULL,
            metadata TEXT NOT NULL CHECK (json_valid(metadata)),
            embedding BLOB NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX facts_by_user ON facts (user_id, created_at, id)",
        """CREATE TABLE history (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            fact_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            event TEXT NOT NULL CHECK (event IN ('ADD', 'UPDATE', 'DELETE')),
            old_text TEXT,
            new_text TEXT,
            at REAL NOT NULL
        )""",
        "CREATE INDEX history_by_fact ON history (fact_id, seq)",
        "CREATE TABLE users (user_id TEXT PRIMARY KEY, created_at REAL NOT NULL) WITHOUT ROWID",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    ),
}

_FACT_COLS = "id, user_id, text, metadata, created_at, updated_at"


def _to_fact(row: Sequence[Any]) -> Fact:
    return Fact(
        id=row[0],
        user_id=row[1],
        text=row[2],
        metadata=json.loads(row[3]),
        created_at=row[4],
        updated_at=row[5],
    )


def _fact_row(fact: Fact) -> tuple[Any, ...]:
    meta = json.dumps(fact.metadata)
    return (fact.id, fact.user_id, fact.text, meta, fact.created_at, fact.updated_at)


def _blob(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


class Tx(TxWrites):
    """The write operations of one open transaction (see :meth:`FactDB.transaction`)."""

    def get(self, fact_id: str, user_id: str) -> Fact | None:
        """Return the fact with this id if it is ``user_id``'s, or ``None``: one query
        that finds no row for an unknown id and for another user's alike."""
        row = self._conn.execute(
            f"SELECT {_FACT_COLS} FROM facts WHERE id = ? AND user_id = ?", (fact_id, user_id)
        ).fetchone()
        return None if row is None else _to_fact(row)

    def insert(self, facts: Sequence[Fact], embeddings: np.ndarray) -> None:
        """Insert new facts with their embeddings, register their users, log ADD."""
        for fact, vec in zip(facts, embeddings, strict=True):
            self._conn.execute(
                f"INSERT INTO facts ({_FACT_COLS}, embedding) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*_fact_row(fact), _blob(vec)),
            )
            self._conn.execute(
                "INSERT OR IGNORE INTO users (user_id, created_at) VALUES (?, ?)",
                (fact.user_id, fact.created_at),
            )
            self._history(fact, "ADD", None, fact.text, fact.created_at)

    def update(self, old: Fact, new: Fact, embedding: np.ndarray) -> None:
        """Replace a fact's text, metadata and embedding; log UPDATE."""
        self._conn.execute(
            "UPDATE facts SET text = ?, metadata = ?, embedding = ?, updated_at = ? WHERE id = ?",
            (new.text, json.dumps(new.metadata), _blob(embedding), new.updated_at, new.id),
        )
        self._history(new, "UPDATE", old.text, new.text, new.updated_at)

    def delete_user_facts(self, user_id: str, at: float) -> list[Fact]:
        """Delete every fact of a user (the user stays known); log DELETE for each."""
        rows = self._conn.execute(
            f"SELECT {_FACT_COLS} FROM facts WHERE user_id = ? ORDER BY created_at, id",
            (user_id,),
        ).fetchall()
        facts = [_to_fact(r) for r in rows]
        for fact in facts:
            self._history(fact, "DELETE", fact.text, None, at)
        self._conn.execute("DELETE FROM facts WHERE user_id = ?", (user_id,))
        return facts


class FactDB(FactQueries):
    """The SQLite file of a fact store.

    Args:
        path: File path (parent folders are created) or ``":memory:"``.

    Raises:
        StoreError: The file is not a SQLite database, or was written by a newer schema.
    """

    _to_fact = staticmethod(_to_fact)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            os.path.expanduser(self.path),
            timeout=30.0,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal" and self.path != ":memory:":
                logger.warning("SQLite at %s refused WAL mode (journal_mode=%s)", self.path, mode)
            conn.execute("PRAGMA synchronous = FULL")
            self._conn = conn
            self._migrate()
        except BaseException as exc:
            conn.close()
            self._conn = None
            if not isinstance(exc, sqlite3.DatabaseError):
                raise
            raise StoreError(
                f"{self.path} cannot be opened as a fact store ({exc}); "
                "point store_path at a new file or at a store written by inferscale-memory"
            ) from exc

    def _migrate(self) -> None:
        with self.transaction() as tx:
            conn = tx._conn
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, newer than this "
                    f"inferscale-memory understands ({SCHEMA_VERSION}); upgrade inferscale-memory"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                logger.info("Migrating fact store %s to schema %d", self.path, target)
                for statement in _MIGRATIONS[target]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the fact store {self.path} is closed; open a new MemoryStore")
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        """Run writes as one transaction: committed (durably) on exit, rolled back on error.

        Yields:
            A :class:`Tx` bound to the open transaction.
        """
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield Tx(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._connection().execute(sql, args).fetchall()

    def get(self, fact_id: str, user_id: str) -> Fact | None:
        """Return the fact with this id if it is ``user_id``'s, or ``None`` (the same query
        for an unknown id and another user's)."""
        rows = self._all(f"SELECT {_FACT_COLS} FROM facts WHERE id = ? AND user_id = ?",
                         (fact_id, user_id))
        return _to_fact(rows[0]) if rows else None

    def get_many(self, user_id: str, ids: Sequence[str]) -> dict[str, Fact]:
        """Return the facts of ``user_id`` among ``ids``, keyed by id."""
        return {r[0]: _to_fact(r) for r in self._owned_rows(_FACT_COLS, user_id, ids)}

    def _owned_rows(self, columns: str, user_id: str, ids: Sequence[str]) -> list[Any]:
        """``columns`` of the rows of ``ids`` that ``user_id`` owns: looked up by primary
        key, the owner checked on the rows found (no scan of the user's rows)."""
        rows: list[Any] = []
        for start in range(0, len(ids), 500):  # stay below SQLite's variable limit
            chunk = list(ids[start : start + 500])
            marks = ", ".join("?" * len(chunk))
            rows += self._all(
                f"SELECT {columns} FROM facts WHERE id IN ({marks}) AND {_OWNED_BY}",
                [*chunk, user_id],
            )
        return rows

    def embeddings_of(self, user_id: str, ids: Sequence[str], dim: int) -> dict[str, np.ndarray]:
        """Return the embeddings of the facts of ``user_id`` among ``ids``, keyed by id
        (float32 rows of ``dim``; an embedding of another size is left out)."""
        return {r[0]: np.frombuffer(r[1], dtype="<f4")
                for r in self._owned_rows("id, embedding", user_id, ids) if len(r[1]) == 4 * dim}

    def embeddings(self, user_id: str) -> tuple[list[str], list[bytes]]:
        """Return a user's fact ids and raw float32 embedding blobs."""
        rows = self._all("SELECT id, embedding FROM facts WHERE user_id = ?", (user_id,))
        return [r[0] for r in rows], [r[1] for r in rows]

    def embedding_matrix(self, user_id: str, dim: int) -> tuple[list[str], np.ndarray]:
        """Return a user's fact ids and their embeddings as a ``(n, dim)`` float32 array.

        Raises:
            StoreError: An embedding of another size than ``dim``.
        """
        ids, blobs = self.embeddings(user_id)
        if any(len(b) != 4 * dim for b in blobs):
            raise StoreError(f"{self.path} has an embedding of the wrong size for {user_id!r}")
        return ids, np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(ids), dim)

    def history(self, fact_id: str, user_id: str) -> list[dict[str, Any]]:
        """Return the events of one fact of one user, oldest first."""
        rows = self._all(
            "SELECT fact_id, user_id, event, old_text, new_text, at FROM history"
            " WHERE fact_id = ? AND user_id = ? ORDER BY seq",
            (fact_id, user_id),
        )
        keys = ("fact_id", "user_id", "event", "old_text", "new_text", "at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def close(self) -> None:
        """Close the connection (idempotent); WAL content is checkpointed by SQLite."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

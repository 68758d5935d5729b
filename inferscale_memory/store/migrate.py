"""Copy a fact store's vectors into a Qdrant collection (``inferscale-memory migrate-index``),
or the whole SQLite store into PostgreSQL (``inferscale-memory migrate-store --to postgres``).

The vectors come from the SQLite file (the truth), so no embedder is loaded. Each user's
points are made equal to the file (:meth:`QdrantIndex.sync`): running it again writes
nothing, and a collection that went stale (facts deleted or changed while it was not in
use) is brought back in line. Users that are in the collection but not in the file are
left alone.

Example:
    >>> cfg = MemoryConfig.load(index="qdrant", qdrant_url="http://qdrant:6333")  # doctest: +SKIP
    >>> print(migrate_to_qdrant(cfg))                                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import ConfigError, StoreError
from inferscale_memory.store.qdrant import QdrantIndex
from inferscale_memory.store.sqlite import FactDB

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigrationReport:
    """What a migration did.

    Attributes:
        store: The SQLite file read.
        target: The Qdrant folder or server URL written.
        collection: The Qdrant collection.
        users: Users of the store.
        facts: Facts (vectors) of the store.
        written: Points upserted (missing or out of date).
        removed: Points deleted (their facts are gone from the store).
        unchanged: Points that were already current.
    """

    store: str
    target: str
    collection: str
    users: int
    facts: int
    written: int
    removed: int
    unchanged: int

    def __str__(self) -> str:
        return (f"{self.store}: {self.facts} facts of {self.users} users -> Qdrant collection "
                f"{self.collection!r} at {self.target}: {self.written} written, "
                f"{self.removed} removed, {self.unchanged} already current")


def migrate_to_qdrant(config: MemoryConfig) -> MigrationReport:
    """Make the Qdrant collection that ``config`` names equal to its fact store.

    Args:
        config: ``store_path`` (or ``data_dir``) names the store; ``index`` must be
            ``"qdrant"``, with ``qdrant_path`` or ``qdrant_url`` (and ``qdrant_collection``).

    Returns:
        Counts of what was written, removed and left alone.

    Raises:
        ConfigError: ``config.index`` is not ``"qdrant"``.
        StoreError: No store file, or a Qdrant that cannot be reached or is in use.
    """
    if config.index != "qdrant":
        raise ConfigError("migrate_to_qdrant needs a config with index='qdrant'")
    path = config.resolved_store_path
    if path == ":memory:" or not Path(path).expanduser().is_file():
        raise StoreError(f"no fact store at {path}; name an existing file (--store or "
                         "store_path)")
    db = FactDB(path)
    try:
        stored_dim = db.get_meta("embedding_dim")
        dim = int(stored_dim) if stored_dim is not None else None
        index = QdrantIndex.from_config(config, dim)
        try:
            return _copy(db, index, dim, path)
        finally:
            index.close()
    finally:
        db.close()


def _copy(db: FactDB, index: QdrantIndex, dim: int | None, path: str) -> MigrationReport:
    users = db.users() if dim is not None else []  # no dimension yet: no fact ever stored
    facts = written = removed = unchanged = 0
    for user_id in users:
        assert dim is not None
        ids, matrix = db.embedding_matrix(user_id, dim)
        stats = index.sync(user_id, ids, matrix)
        facts += len(ids)
        written, removed = written + stats.written, removed + stats.removed
        unchanged += stats.unchanged
        logger.info("Migrated %r: %s", user_id, stats)
    return MigrationReport(path, index.location, index.collection, len(users), facts, written,
                           removed, unchanged)


@dataclass(frozen=True)
class StoreCopyReport:
    """What ``migrate-store --to postgres`` did.

    Attributes:
        store: The SQLite file read.
        target: The PostgreSQL database written (password left out).
        users: Users of the SQLite store.
        facts: Facts of the SQLite store.
        written: Facts inserted or brought up to date.
        removed: Facts deleted from the target because the SQLite store deleted them.
        unchanged: Facts that were already equal.
        events: History events copied (those already there are skipped).
    """

    store: str
    target: str
    users: int
    facts: int
    written: int
    removed: int
    unchanged: int
    events: int

    def __str__(self) -> str:
        return (f"{self.store}: {self.facts} facts of {self.users} users -> PostgreSQL "
                f"{self.target}: {self.written} written, {self.removed} removed, "
                f"{self.unchanged} already current, {self.events} history events copied")


def migrate_to_postgres(config: MemoryConfig) -> StoreCopyReport:
    """Copy the SQLite store that ``config`` names into its PostgreSQL store, in one
    transaction; running it again writes nothing.

    Facts keep their ids, timestamps, metadata, embeddings and history. A fact of the file
    that is in the target with other content is overwritten by the file's; a fact that the
    file deleted (its history says so) is deleted from the target; anything else of the
    target (facts added there directly) is left alone. No embedder is loaded.

    Args:
        config: ``store_path`` (or ``data_dir``) names the SQLite file, ``postgres_url`` the
            target (``store`` must be ``"postgres"``).

    Raises:
        ConfigError: ``config.store`` is not ``"postgres"``.
        StoreError: No SQLite file, an unreachable target, or one holding embeddings of
            another dimension.
    """
    from inferscale_memory.store.postgres import PostgresFactDB

    if config.store != "postgres" or config.postgres_url is None:
        raise ConfigError("migrate_to_postgres needs a config with store='postgres' and "
                          "postgres_url")
    path = config.resolved_store_path
    if path == ":memory:" or not Path(path).expanduser().is_file():
        raise StoreError(f"no fact store at {path}; name an existing file (--store or "
                         "store_path)")
    source = FactDB(path)
    try:
        target = PostgresFactDB(config.postgres_url)
        try:
            return _copy_store(source, target, path)
        finally:
            target.close()
    finally:
        source.close()


def _copy_store(source: FactDB, target: Any, path: str) -> StoreCopyReport:
    meta = dict(source._all("SELECT key, value FROM meta"))
    users = source._all("SELECT user_id, created_at FROM users ORDER BY user_id")
    keys = ("fact_id", "user_id", "event", "old_text", "new_text", "at")
    events = [dict(zip(keys, r, strict=True)) for r in source._all(
        "SELECT fact_id, user_id, event, old_text, new_text, at FROM history ORDER BY seq")]
    facts = written = removed = copied = 0
    with target.copy() as copy:
        for key, value in meta.items():
            held = copy.meta(key, value)
            if key == "embedding_dim" and held != value:
                raise StoreError(f"{target.path} holds embeddings of dimension {held}, "
                                 f"{path} of {value}; copy into a new database")
        for user_id, created_at in users:
            copy.user(user_id, created_at)
            live = source.list_user(user_id)
            if live:
                ids, matrix = source.embedding_matrix(user_id, int(meta["embedding_dim"]))
                vectors = dict(zip(ids, matrix, strict=True))
                done = [copy.fact(fact, vectors[fact.id]) for fact in live]
                facts, written = facts + len(done), written + sum(done)
        alive = {r[0] for r in source._all("SELECT id FROM facts")}
        gone = {e["fact_id"] for e in events if e["event"] == "DELETE"} - alive
        removed = sum(copy.remove(fact_id) for fact_id in sorted(gone))
        copied = sum(copy.event(event) for event in events)
    report = StoreCopyReport(path, target.path, len(users), facts, written, removed,
                             facts - written, copied)
    logger.info("%s", report)
    return report

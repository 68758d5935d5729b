"""Copy a fact store's vectors into a Qdrant collection (``inferscale-memory migrate-index``).

The vectors come from the SQLite file (the truth), so no embedder is loaded. Each user's
points are made equal to the file (:meth:`QdrantIndex.sync`): running it again writes
nothing, and a collection that went stale (facts deleted or changed while it was not in
use) is brought back in line. Tenants that are in the collection but not in the file are
left alone.

Example:
    >>> cfg = MemoryConfig.load(index="qdrant", qdrant_url="http://qdrant:6333")  # doctest: +SKIP
    >>> print(migrate_to_qdrant(cfg))                                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

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

"""The durable, multi-user fact store: :class:`MemoryStore`.

The SQLite file (or a PostgreSQL database, given a ``postgresql://`` URL) is the truth; the
vector index is made equal to it on open (rebuilt, or for a persistent index such as Qdrant,
reconciled: only what differs is written; PostgreSQL searches its own table). Every write
is validated first (bad input raises a typed error and changes nothing), committed as one
durable transaction, then applied to the index. A search hit whose fact is not in the file
(an index that went stale) is dropped from the index.

Example:
    >>> from inferscale_memory.embeddings import default_embedder
    >>> with MemoryStore(":memory:", default_embedder()) as store:
    ...     fact = store.add("Caroline moved to Berlin in May 2023.", user_id="caroline")
    ...     store.search("Where does Caroline live?", user_id="caroline", k=1)[0].fact.text
    'Caroline moved to Berlin in May 2023.'
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from inferscale_memory.errors import (
    FactNotFoundError,
    InvalidInputError,
    StoreError,
    UnknownUserError,
)
from inferscale_memory.fields import CONTEXT_ORDERS, ContextOrder, in_context_order
from inferscale_memory.store import _checks
from inferscale_memory.store.backends import open_index
from inferscale_memory.store.facts import Fact, ScoredFact
from inferscale_memory.store.index import ExactIndex, VectorIndex
from inferscale_memory.store.sqlite import FactDB

if TYPE_CHECKING:
    from inferscale_memory.config import MemoryConfig

logger = logging.getLogger(__name__)


def _open_db(path: str | os.PathLike[str]) -> Any:
    """The SQLite file, or the PostgreSQL database that a ``postgresql://`` URL names."""
    from inferscale_memory.store.postgres import PostgresFactDB, is_postgres_url

    return PostgresFactDB(os.fspath(path)) if is_postgres_url(path) else FactDB(path)


class MemoryStore:
    """Facts of many users, with embeddings and a vector index; thread-safe.

    Args:
        path: SQLite file (parent folders are created), ``":memory:"``, or a PostgreSQL
            URL (``postgresql://...``, with pgvector: the ``postgres`` extra), which
            several processes may share.
        embedder: Object with ``dim`` and ``embed(list[str]) -> ndarray (n, dim)``.
        index: Vector index to fill; ``None`` uses an in-process :class:`ExactIndex`
            (for PostgreSQL: exact search in SQL, so every sharer sees each commit).
            Every user of the file is reloaded into it on open (:meth:`VectorIndex.replace`).
        max_fact_chars: Longest fact text accepted, in characters.
        own_index: Close ``index`` when the store closes (an index made here always is).
        hnsw: PostgreSQL with ``index=None`` only: search through a pgvector HNSW index
            (approximate; created if missing) instead of an exact scan of the user's rows.

    Raises:
        InvalidInputError: Bad ``embedder`` or ``max_fact_chars``.
        StoreError: The file is not a store, is newer than this version, or holds
            embeddings of another dimension than ``embedder.dim``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        embedder: _checks.Embedder,
        index: VectorIndex | None = None,
        max_fact_chars: int = 4000,
        *,
        own_index: bool = False,
        hnsw: bool = False,
    ) -> None:
        self._owns_index = own_index or index is None
        self._max_fact_chars = _checks.positive_int(max_fact_chars, "max_fact_chars")
        self._embedder = embedder
        self._dim = _checks.embedder_dim(embedder)
        self._lock = threading.RLock()
        self._db = _open_db(path)
        self.path = self._db.path
        self._closed = False
        try:
            _checks.embedder_matches(self._db, self._embedder, self._dim)
            self._index = index if index is not None else self._default_index(hnsw)
            self._last_ts = self._db.last_timestamp()
            for user_id in self._db.users():
                self._load_user(user_id)
        except BaseException:
            self._db.close()
            if own_index and index is not None:
                index.close()
            raise
        logger.info("Opened fact store %s (%d users)", self.path, len(self._db.users()))

    @classmethod
    def from_config(cls, config: MemoryConfig,
                    embedder: _checks.Embedder | None = None) -> MemoryStore:
        """Open the store file and the index that ``config`` names; the store owns the index.

        Args:
            config: Uses ``store`` with ``store_path`` (or ``data_dir``) or
                ``postgres_url``, ``index`` and ``qdrant_*``.
            embedder: ``None`` loads ``config.embedder`` (all-MiniLM-L6-v2 by default).

        Example:
            >>> cfg = MemoryConfig.load(store_path=":memory:", index="qdrant")  # doctest: +SKIP
            >>> store = MemoryStore.from_config(cfg)                            # doctest: +SKIP
        """
        if embedder is None:
            from inferscale_memory.embeddings import default_embedder

            embedder = default_embedder(config.embedder)
        dim = _checks.embedder_dim(embedder)
        if config.store != "postgres":
            return cls(config.resolved_store_path, embedder, open_index(config, dim),
                       own_index=True)
        assert config.postgres_url is not None  # the config checks it
        index = open_index(config, dim) if config.index == "qdrant" else None
        return cls(config.postgres_url, embedder, index, own_index=True,
                   hnsw=config.index == "hnsw")

    def _default_index(self, hnsw: bool) -> VectorIndex:
        if isinstance(self._db, FactDB):
            if hnsw:
                raise InvalidInputError("hnsw=True needs a PostgreSQL store (postgresql://...)")
            return ExactIndex(self._dim)
        from inferscale_memory.store.postgres import PgVectorIndex

        return PgVectorIndex(self._db, self._dim, hnsw)

    def _load_user(self, user_id: str) -> None:
        """Make one user's index entries equal to the file's."""
        if getattr(self._index, "searches_store", False):  # PostgreSQL's own table: nothing
            return                                         # to load (and 100k vectors to skip)
        ids, matrix = self._db.embedding_matrix(user_id, self._dim)
        self._index.replace(user_id, ids, matrix)

    def _apply_to_index(self, user_id: str, op: Callable[[], None]) -> None:
        """Apply a committed change to the index; on failure rebuild the user from the file."""
        try:
            op()
        except Exception:
            logger.exception("Index update failed for %r; rebuilding from %s", user_id, self.path)
            self._load_user(user_id)

    def _now(self) -> float:
        """Unix time, strictly increasing within this store (so adds keep their order)."""
        self._last_ts = max(time.time(), self._last_ts + 1e-6)
        return self._last_ts

    def _open(self) -> None:
        if self._closed:
            raise StoreError(f"the fact store {self.path} is closed; open a new MemoryStore")

    def _known_user(self, user_id: str) -> str:
        user_id = _checks.user_id(user_id)
        self._open()
        if not self._db.has_user(user_id):
            raise UnknownUserError(
                f"user {user_id!r} has no facts yet; add facts with "
                f"add(text, user_id={user_id!r}) first"
            )
        return user_id

    @classmethod
    def _owned(cls, tx: Any, fact_id: str, user_id: str) -> Fact:
        """The fact, if it exists and belongs to ``user_id``; else FactNotFoundError."""
        fact = tx.get(fact_id, user_id)
        if fact is None:
            raise cls._not_found(fact_id, user_id)
        return fact

    @staticmethod
    def _not_found(fact_id: str, user_id: str) -> FactNotFoundError:
        # One message whether the id is unknown or another user's: never tell which.
        return FactNotFoundError(
            f"no fact {fact_id!r} for user {user_id!r}; list(user_id=...) shows the user's facts"
        )

    def add(
        self,
        text_or_texts: str | Sequence[str],
        *,
        user_id: str,
        metadata: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    ) -> Fact | list[Fact]:
        """Add one fact (a str) or a batch (a sequence of str, one transaction).

        Args:
            text_or_texts: The fact text, or a sequence of them.
            user_id: Owner of the facts.
            metadata: One dict for every fact, a sequence of one dict per fact, or ``None``.

        Returns:
            The new :class:`Fact` for a str, else the list of new facts in input order.

        Raises:
            InvalidInputError: Any bad text, metadata or user id (then nothing is added).
        """
        user_id = _checks.user_id(user_id)
        single = isinstance(text_or_texts, str)
        raw = [text_or_texts] if single else _checks.text_list(text_or_texts)
        texts = [_checks.text(t, self._max_fact_chars) for t in raw]
        metas = _checks.metadata_list(metadata, len(texts), single)
        self._open()
        if not texts:
            return []
        vectors = _checks.embed(self._embedder, texts, self._dim)
        with self._lock:
            self._open()
            facts = []
            for text, meta in zip(texts, metas, strict=True):
                now = self._now()
                facts.append(Fact(uuid.uuid4().hex, user_id, text, meta, now, now))
            with self._db.transaction() as tx:
                tx.insert(facts, vectors)
            ids = [f.id for f in facts]
            self._apply_to_index(user_id, lambda: self._index.upsert(user_id, ids, vectors))
        logger.debug("Added %d fact(s) for %r", len(facts), user_id)
        return facts[0] if single else facts

    def check_text(self, text: Any) -> str:
        """Check one fact text as :meth:`add` and :meth:`update` do, without storing it.

        Raises:
            InvalidInputError: Not a str, blank, longer than ``max_fact_chars`` or not
                valid Unicode.
        """
        return _checks.text(text, self._max_fact_chars)

    def check_texts(self, texts: Any) -> builtins.list[str]:
        """Check a batch of fact texts as :meth:`add` does, without storing them."""
        return [self.check_text(t) for t in _checks.text_list(texts)]

    def get(self, fact_id: str, *, user_id: str) -> Fact:
        """Return one fact of the user; :class:`FactNotFoundError` if none (or another's)."""
        user_id = _checks.user_id(user_id)
        fact_id = _checks.fact_id(fact_id)
        self._open()
        fact = self._db.get(fact_id, user_id)
        if fact is None:
            raise self._not_found(fact_id, user_id)
        return fact

    def list(self, *, user_id: str) -> list[Fact]:
        """Return the user's facts, oldest first (by ``created_at``, then id)."""
        return self._db.list_user(self._known_user(user_id))

    def search(self, query: str, *, user_id: str, k: int) -> builtins.list[ScoredFact]:
        """Return the user's ``k`` facts most similar to ``query``, best first.

        Raises:
            InvalidInputError: Blank query or bad ``k``.
            UnknownUserError: The user never stored a fact.
        """
        query = _checks.query(query)
        k = _checks.positive_int(k)
        user_id = self._known_user(user_id)
        vector = _checks.embed(self._embedder, [query], self._dim)[0]
        with self._lock:
            self._open()
            hits, facts = self._search_once(user_id, vector, k)
            if len(facts) < len(hits):  # stale ids, now dropped: one more try fills k
                hits, facts = self._search_once(user_id, vector, k)
        return [ScoredFact(facts[fid], score) for fid, score in hits if fid in facts]

    def neighbours(self, facts: Sequence[Fact], *, user_id: str, k: int,
                   order: ContextOrder = "added") -> builtins.list[builtins.list[Fact]]:
        """Per fact of ``facts``, the ``k`` other facts of ``user_id`` most similar to it,
        in the order they were added (by ``created_at``, then id), or with ``order=
        "similarity"`` least similar first (the nearest one last).

        A stored fact's own embedding is the query, so no text is embedded again; facts
        the store does not hold (another store's, e.g. Mem0's) are embedded, in one call.
        Nothing beyond the hits is read, so the cost per fact does not grow with the
        facts the user holds beyond the index's own search.

        Raises:
            InvalidInputError: Bad ``k`` or ``order``.
            UnknownUserError: The user never stored a fact.
        """
        k = _checks.positive_int(k)
        if order not in CONTEXT_ORDERS:
            raise InvalidInputError(f"order must be one of {CONTEXT_ORDERS}, not {order!r}")
        user_id = self._known_user(user_id)
        if not facts:
            return []
        self._open()
        stored = self._db.embeddings_of(user_id, [f.id for f in facts], self._dim)
        foreign = [f for f in facts if f.id not in stored]
        if foreign:
            vectors = _checks.embed(self._embedder, [f.text for f in foreign], self._dim)
            stored.update(zip([f.id for f in foreign], vectors, strict=True))
        out = []
        for fact in facts:
            with self._lock:
                self._open()
                hits, found = self._search_once(user_id, stored[fact.id], k + 1)
            near = [found[fid] for fid, _ in hits if fid in found and fid != fact.id][:k]
            out.append(in_context_order(near, order, added=lambda f: (f.created_at, f.id)))
        return out

    def _search_once(self, user_id: str, vector: np.ndarray,
                     k: int) -> tuple[builtins.list[tuple[str, float]], dict[str, Fact]]:
        """Search the index, read the hits' facts, and drop hits that have no fact."""
        hits = self._index.search(user_id, vector, k)
        facts = self._db.get_many(user_id, [fid for fid, _ in hits])
        stale = [fid for fid, _ in hits if fid not in facts]
        if stale:
            # Index writes follow commits, so an id without a fact is stale (e.g. a shared
            # Qdrant that another process reconciled): drop it.
            logger.warning("The index of %r has %d id(s) missing from %s; removing them",
                           user_id, len(stale), self.path)
            self._apply_to_index(user_id, lambda: self._index.remove(user_id, stale))
        return hits, facts

    def update(
        self, fact_id: str, text: str, *, user_id: str, metadata: dict[str, Any] | None = None
    ) -> Fact:
        """Replace a fact's text (and embedding); ``metadata=None`` keeps the old metadata."""
        user_id = _checks.user_id(user_id)
        fact_id = _checks.fact_id(fact_id)
        text = _checks.text(text, self._max_fact_chars)
        meta = None if metadata is None else _checks.metadata(metadata)
        self.get(fact_id, user_id=user_id)  # fail fast before embedding
        vector = _checks.embed(self._embedder, [text], self._dim)
        with self._lock:
            self._open()
            with self._db.transaction() as tx:
                old = self._owned(tx, fact_id, user_id)
                new_meta = old.metadata if meta is None else meta
                new = Fact(fact_id, user_id, text, new_meta, old.created_at, self._now())
                tx.update(old, new, vector[0])
            self._apply_to_index(user_id, lambda: self._index.upsert(user_id, [fact_id], vector))
        return new

    def delete(self, fact_id: str, *, user_id: str) -> Fact:
        """Delete one fact of the user and return it (its history is kept)."""
        user_id = _checks.user_id(user_id)
        fact_id = _checks.fact_id(fact_id)
        with self._lock:
            self._open()
            with self._db.transaction() as tx:
                old = self._owned(tx, fact_id, user_id)
                tx.delete(old, self._now())
            self._apply_to_index(user_id, lambda: self._index.remove(user_id, [fact_id]))
        return old

    def delete_all(self, *, user_id: str) -> int:
        """Delete every fact of the user (who stays known); return how many were deleted."""
        user_id = self._known_user(user_id)
        with self._lock:
            self._open()
            with self._db.transaction() as tx:
                deleted = tx.delete_user_facts(user_id, self._now())
            self._apply_to_index(user_id, lambda: self._index.clear(user_id))
        return len(deleted)

    def history(self, fact_id: str, *, user_id: str) -> builtins.list[dict[str, Any]]:
        """Return the ADD/UPDATE/DELETE events of a fact of the user, oldest first.

        Each event is a dict with ``fact_id``, ``user_id``, ``event``, ``old_text``,
        ``new_text`` and ``at``. The history of a deleted fact stays available.
        """
        user_id = _checks.user_id(user_id)
        fact_id = _checks.fact_id(fact_id)
        self._open()
        events = self._db.history(fact_id, user_id)
        if not events:
            raise self._not_found(fact_id, user_id)
        return events

    def users(self) -> builtins.list[str]:
        """Return every user that ever stored a fact, sorted."""
        self._open()
        return self._db.users()

    def counts(self) -> tuple[int, int]:
        """Return (users that ever stored a fact, facts stored now), without reading them."""
        self._open()
        return self._db.counts()

    def has_user(self, user_id: str) -> bool:
        """Whether the user ever stored a fact (still true after :meth:`delete_all`)."""
        user_id = _checks.user_id(user_id)
        self._open()
        return self._db.has_user(user_id)

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return self._dim

    @property
    def index(self) -> VectorIndex:
        """The vector index the store keeps in step with the file."""
        return self._index

    def close(self) -> None:
        """Close the file, and the index if the store owns it (idempotent).

        Later calls raise :class:`StoreError`.
        """
        with self._lock:
            if not self._closed and self._owns_index:
                self._index.close()
            self._closed = True
            self._db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"MemoryStore(path={self.path!r}, dim={self._dim}, {state})"

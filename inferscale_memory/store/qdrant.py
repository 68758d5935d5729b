"""A :class:`~inferscale_memory.store.index.VectorIndex` kept in Qdrant: :class:`QdrantIndex`.

One collection holds every user. Each point carries its user id (a keyword payload field
indexed with Qdrant's ``is_tenant``), the fact id and a digest of its vector; every search,
count, remove and clear filters on the user, so a user never sees another user's vectors.
Qdrant point ids must be UUIDs or integers: a point's id is a UUID5 of ``(user id, fact id)``,
so the same fact always lands on the same point and upserts are idempotent.

Modes: embedded (``path=":memory:"`` or a folder; qdrant-client's local mode, exact search in
Python, one process per folder) or a server (``url=...``, ``api_key=...``), which several
processes can share. ``qdrant-client`` is imported lazily: it is the ``qdrant`` extra.

Example:
    >>> import numpy as np
    >>> index = QdrantIndex(":memory:")                          # doctest: +SKIP
    >>> index.upsert("caroline", ["f1", "f2"], np.eye(2))        # doctest: +SKIP
    >>> index.search("caroline", np.array([1.0, 0.1]), k=1)      # doctest: +SKIP
    [('f1', 0.995...)]
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from inferscale_memory.errors import ConfigError, InvalidInputError, StoreError
from inferscale_memory.store import _qdrant_schema as schema
from inferscale_memory.store._qdrant_schema import FACT_KEY, USER_KEY, point_id
from inferscale_memory.store.index import (
    VectorIndex,
    check_ids,
    check_query,
    normalize_rows,
    top_k,
)

if TYPE_CHECKING:
    from inferscale_memory.config import MemoryConfig

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "inferscale_facts"
BATCH = 512  # points per request: well below a server's default 32 MiB request limit


@dataclass(frozen=True)
class SyncStats:
    """What :meth:`QdrantIndex.sync` changed for one user.

    Attributes:
        written: Points upserted (missing or with another vector).
        removed: Points deleted (ids the user no longer has).
        unchanged: Points already current.
    """

    written: int
    removed: int
    unchanged: int


class QdrantIndex(VectorIndex):
    """Per-user cosine search in one Qdrant collection; thread-safe.

    Args:
        path: Folder of an embedded Qdrant, or ``":memory:"``; ``None`` (with no ``url``)
            means ``":memory:"``. A folder can be open in one process at a time.
        url: A Qdrant server, e.g. ``"http://qdrant:6333"`` (instead of ``path``).
        api_key: The server's API key.
        collection: Collection name; created on first use (cosine distance, an
            ``is_tenant`` index on the user id, per-user HNSW graphs).
        dim: Vector dimension; ``None`` takes it from the collection or the first upsert.

    Raises:
        MissingDependencyError: ``qdrant-client`` is not installed.
        ConfigError: Both ``path`` and ``url``, ``api_key`` without ``url``, or an existing
            collection whose vectors are not single cosine vectors of size ``dim``.
        StoreError: The server cannot be reached, or the folder is in use by another process.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        api_key: str | None = None,
        collection: str = DEFAULT_COLLECTION,
        dim: int | None = None,
    ) -> None:
        if path is not None and url is not None:
            raise ConfigError("give a Qdrant path (embedded) or url (a server), not both")
        if api_key is not None and url is None:
            raise ConfigError("a Qdrant api_key needs a url (embedded Qdrant has no keys)")
        qdrant = schema.import_qdrant()
        self._models = qdrant.models
        self._collection = collection
        self._dim = dim
        self._lock = threading.RLock()
        self._closed = False
        self._local = url is None
        self.location = url if url is not None else os.fspath(path or ":memory:")
        if url is not None:
            self._client = qdrant.QdrantClient(url=url, api_key=api_key)
        elif self.location == ":memory:":
            self._client = qdrant.QdrantClient(location=":memory:")
        else:
            self._client = self._open_folder(qdrant, self.location)
        try:
            with self._calls():
                self._dim = schema.open_collection(self._client, collection, dim, not self._local)
        except BaseException:
            self._client.close()
            raise

    @classmethod
    def from_config(cls, config: MemoryConfig, dim: int | None = None) -> QdrantIndex:
        """The index that ``config``'s ``qdrant_*`` fields name (see ``resolved_qdrant_path``)."""
        return cls(config.resolved_qdrant_path, url=config.qdrant_url,
                   api_key=config.qdrant_api_key, collection=config.qdrant_collection, dim=dim)

    @staticmethod
    def _open_folder(qdrant: Any, path: str) -> Any:
        try:
            return qdrant.QdrantClient(path=path)
        except RuntimeError as exc:  # qdrant-client's message for a folder locked by another
            raise StoreError(
                f"the Qdrant folder {path} is already open (by another process or index): "
                f"{exc} Several processes must share a Qdrant server (qdrant_url) instead"
            ) from exc

    @contextlib.contextmanager
    def _calls(self) -> Iterator[None]:
        """Hold the lock and turn the client's transport errors into :class:`StoreError`."""
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        with self._lock:
            try:
                yield
            except (ResponseHandlingException, UnexpectedResponse, OSError) as exc:
                raise StoreError(
                    f"Qdrant at {self.location} failed ({exc}); check qdrant_url, "
                    f"qdrant_api_key and that the server is up"
                ) from exc

    @property
    def dim(self) -> int | None:
        """The vector dimension, or ``None`` before the collection exists."""
        return self._dim

    @property
    def collection(self) -> str:
        """The collection name."""
        return self._collection

    def _create_collection(self, dim: int) -> None:
        self._dim = schema.create_collection(self._client, self._collection, dim,
                                             not self._local)

    def _of_user(self, user_id: str, *conditions: Any) -> Any:
        if not isinstance(user_id, str) or not user_id:
            raise InvalidInputError(f"user_id must be a non-empty string; got {user_id!r}")
        match = self._models.FieldCondition(key=USER_KEY,
                                            match=self._models.MatchValue(value=user_id))
        return self._models.Filter(must=[match, *conditions])

    def _write(self, user_id: str, ids: Sequence[str], mat: np.ndarray) -> None:
        for start in range(0, len(ids), BATCH):
            chunk = ids[start:start + BATCH]
            rows = mat[start:start + BATCH]
            payloads = [schema.payload(user_id, fid, row)
                        for fid, row in zip(chunk, rows, strict=True)]
            batch = self._models.Batch(ids=[point_id(user_id, fid) for fid in chunk],
                                       vectors=rows.tolist(), payloads=payloads)
            self._client.upsert(self._collection, points=batch, wait=True)

    def _delete(self, user_id: str, ids: Sequence[str]) -> None:
        for start in range(0, len(ids), BATCH):
            has_id = self._models.HasIdCondition(
                has_id=[point_id(user_id, fid) for fid in ids[start:start + BATCH]])
            selector = self._models.FilterSelector(filter=self._of_user(user_id, has_id))
            self._client.delete(self._collection, points_selector=selector, wait=True)

    def _checked(self, ids: Sequence[str], vectors: np.ndarray) -> tuple[list[str], np.ndarray]:
        ids = check_ids(ids)
        if not ids and np.asarray(vectors).size == 0:
            return ids, np.empty((0, self._dim or 1), dtype=np.float32)
        mat = normalize_rows(vectors, self._dim)
        if mat.shape[0] != len(ids):
            raise InvalidInputError(f"{len(ids)} ids but {mat.shape[0]} vectors")
        return ids, mat

    def upsert(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        self._of_user(user_id)
        with self._calls():
            ids, mat = self._checked(ids, vectors)
            if not ids:
                return
            if self._dim is None:
                self._create_collection(mat.shape[1])
            self._write(user_id, ids, mat)

    def remove(self, user_id: str, ids: Sequence[str]) -> None:
        self._of_user(user_id)
        with self._calls():
            if self._dim is not None and ids:
                self._delete(user_id, list(ids))

    def clear(self, user_id: str) -> None:
        selector = self._models.FilterSelector(filter=self._of_user(user_id))
        with self._calls():
            if self._dim is not None:
                self._client.delete(self._collection, points_selector=selector, wait=True)

    def search(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        k = check_query(vector, k)
        of_user = self._of_user(user_id)
        with self._calls():
            if self._dim is None:
                return []
            query = normalize_rows(vector, self._dim)[0].tolist()
            # Ask for more than k until the k-th score's whole tie group is in, so that
            # ties are broken by id here, not by Qdrant's internal order.
            limit = k + 1
            while True:
                points = self._client.query_points(
                    self._collection, query=query, query_filter=of_user, limit=limit,
                    with_payload=[FACT_KEY]).points
                if len(points) < limit or points[-1].score < points[k - 1].score:
                    break
                limit *= 2
        scores = np.array([p.score for p in points], dtype=np.float64)
        return top_k([p.payload[FACT_KEY] for p in points], scores, k)

    def count(self, user_id: str) -> int:
        of_user = self._of_user(user_id)
        with self._calls():
            if self._dim is None:
                return 0
            return int(self._client.count(self._collection, count_filter=of_user,
                                          exact=True).count)

    def digests(self, user_id: str) -> dict[str, str | None]:
        """Return ``{fact id: vector digest}`` of every point of the user (a scroll)."""
        of_user = self._of_user(user_id)
        out: dict[str, str | None] = {}
        with self._calls():
            if self._dim is None:
                return out
            offset = None
            while True:
                records, offset = self._client.scroll(
                    self._collection, scroll_filter=of_user, limit=1024, offset=offset,
                    with_payload=[FACT_KEY, schema.DIGEST_KEY], with_vectors=False)
                out.update((r.payload[FACT_KEY], r.payload.get(schema.DIGEST_KEY))
                           for r in records)
                if offset is None:
                    return out

    def sync(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> SyncStats:
        """Make the user's points exactly ``ids``/``vectors``, writing only what differs.

        Points that are missing or hold another vector are upserted; points of ids not in
        ``ids`` are deleted. Running it twice changes nothing the second time.

        Returns:
            What was written, removed and left alone.

        Raises:
            InvalidInputError: As :meth:`upsert`.
        """
        self._of_user(user_id)
        with self._calls():
            ids, mat = self._checked(ids, vectors)
            if ids and self._dim is None:
                self._create_collection(mat.shape[1])
            stored = self.digests(user_id)
            wanted = {fid: schema.vector_digest(row) for fid, row in zip(ids, mat, strict=True)}
            rows = [i for i, fid in enumerate(ids) if stored.get(fid) != wanted[fid]]
            stale = [ids[i] for i in rows]
            gone = [fid for fid in stored if fid not in wanted]
            if stale:
                self._write(user_id, stale, mat[rows])
            if gone:
                self._delete(user_id, gone)
        return SyncStats(written=len(stale), removed=len(gone),
                         unchanged=len(ids) - len(stale))

    def replace(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        self.sync(user_id, ids, vectors)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._client.close()

    def __repr__(self) -> str:
        return f"QdrantIndex(location={self.location!r}, collection={self._collection!r})"

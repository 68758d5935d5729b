"""Vector indexes of the fact store: :class:`VectorIndex` and :class:`ExactIndex`.

:class:`VectorIndex` is the interface of every backend; :class:`ExactIndex` is the embedded
default, exact search with numpy; :class:`~inferscale_memory.store.qdrant.QdrantIndex` keeps
the vectors in Qdrant (embedded or a server). :func:`~inferscale_memory.store.backends.open_index`
picks one; this module knows no backend but its own.

Every index keeps one namespace per user: a search only ever sees the vectors of the user
it names. Scores are cosine similarities of L2-normalised vectors; results are ordered best
first, ties broken by ascending id, so that the same data always gives the same answer.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from inferscale_memory.errors import InvalidInputError

logger = logging.getLogger(__name__)


def normalize_rows(vectors: np.ndarray, dim: int | None = None) -> np.ndarray:
    """Check a batch of vectors and return it L2-normalised as float32.

    Args:
        vectors: Array of shape ``(n, d)`` (or ``(d,)``, taken as one row).
        dim: The dimension required, if known.

    Returns:
        A new C-contiguous float32 array of shape ``(n, d)`` with unit rows.

    Raises:
        InvalidInputError: Wrong shape or dimension, non-finite values or a zero vector.
    """
    arr = np.asarray(vectors, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise InvalidInputError(f"vectors must have shape (n, dim); got {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise InvalidInputError(f"vectors have dimension {arr.shape[1]}; the index holds {dim}")
    if not np.all(np.isfinite(arr)):
        raise InvalidInputError("vectors contain NaN or infinite values")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise InvalidInputError("a zero vector has no direction and cannot be indexed")
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def check_ids(ids: Sequence[str]) -> list[str]:
    """Check the ids of one upsert: non-empty strings, no duplicates; return them as a list.

    Raises:
        InvalidInputError: An id that is not a non-empty str, or a repeated id.
    """
    ids = list(ids)
    if not all(isinstance(i, str) and i for i in ids):
        raise InvalidInputError("ids must be non-empty strings")
    if len(set(ids)) != len(ids):
        raise InvalidInputError("ids of one upsert must be unique")
    return ids


# Above any user's fact count and inside every backend's integer (PostgreSQL's LIMIT is a
# bigint, Qdrant's limit an uint64): a larger k asks for the same thing, all of them.
K_CEILING = 2**31 - 1


def check_query(vector: np.ndarray, k: int) -> int:
    """Check a search's ``k`` (an int >= 1) and the query's shape ``(dim,)``; return ``k``.

    A ``k`` above :data:`K_CEILING` comes back as ``K_CEILING``: every fact either way.

    Raises:
        InvalidInputError: Bad ``k`` or a query that is not one vector.
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise InvalidInputError(f"k must be an integer >= 1; got {k!r}")
    if np.asarray(vector).ndim != 1:
        raise InvalidInputError("the query vector must have shape (dim,)")
    return min(int(k), K_CEILING)


def top_k(ids: Sequence[str], scores: np.ndarray, k: int) -> list[tuple[str, float]]:
    """Return the ``k`` best ``(id, score)`` pairs, best first, ties by ascending id.

    Args:
        ids: The ids (str), one per score; only the candidates' ids are read.
        scores: Array of scores.
        k: How many to return (fewer if there are fewer).

    Returns:
        The selected pairs, scores as Python floats.
    """
    n = len(scores)
    if n == 0:
        return []
    if k < n:
        # Everything that ties with the k-th best score must compete on id, so take the
        # whole tie group at the boundary before the exact sort.
        kth = np.partition(scores, n - k)[n - k]
        cand = np.nonzero(scores >= kth)[0]
    else:
        cand = np.arange(n)
    cand_ids = np.array([ids[i] for i in cand])
    order = np.lexsort((cand_ids, -scores[cand]))[:k]
    return [(str(cand_ids[i]), float(scores[cand[i]])) for i in order]


class VectorIndex(ABC):
    """Per-user nearest-neighbour index over L2-normalised vectors.

    Implementations must be thread-safe. Ids are unique within a user; upserting an id
    that exists replaces its vector.
    """

    @abstractmethod
    def upsert(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Insert or replace vectors of one user.

        Args:
            user_id: The namespace.
            ids: One id per row of ``vectors``, no duplicates.
            vectors: Array ``(len(ids), dim)``; normalised by the index.

        Raises:
            InvalidInputError: Mismatched lengths, duplicate ids or bad vectors.
        """

    @abstractmethod
    def remove(self, user_id: str, ids: Sequence[str]) -> None:
        """Remove vectors of one user; ids that are not there are ignored."""

    @abstractmethod
    def clear(self, user_id: str) -> None:
        """Remove every vector of one user (a no-op for an unknown user)."""

    @abstractmethod
    def search(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Return the ``k`` nearest ids of one user by cosine similarity.

        Args:
            user_id: The namespace; an unknown user gives ``[]``.
            vector: The query, shape ``(dim,)``; normalised by the index.
            k: Maximum number of results, ``>= 1``.

        Returns:
            ``(id, score)`` pairs, best first, ties broken by ascending id.
        """

    @abstractmethod
    def count(self, user_id: str) -> int:
        """Return how many vectors the user has."""

    def replace(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Make ``ids`` and ``vectors`` the user's whole namespace.

        The store calls this for every user when it opens, with the user's rows of the
        SQLite file, so that an index that outlives the process (Qdrant) ends up equal to
        the file. This default clears the user and upserts everything; a persistent backend
        should write only what differs.

        Args:
            user_id: The namespace.
            ids: Every id the user must have, no duplicates (empty: clear the user).
            vectors: Array ``(len(ids), dim)``.

        Raises:
            InvalidInputError: As :meth:`upsert`.
        """
        self.clear(user_id)
        if len(ids):
            self.upsert(user_id, ids, vectors)

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for in-process indexes
        """Release connections or files held by the index (idempotent)."""


class _UserMatrix:
    """Vectors of one user: rows ``[:n]`` of a buffer that grows by doubling."""

    __slots__ = ("ids", "rows", "buf", "n")

    def __init__(self, dim: int) -> None:
        self.ids: list[str] = []
        self.rows: dict[str, int] = {}
        self.buf = np.empty((8, dim), dtype=np.float32)
        self.n = 0

    def put(self, fact_id: str, vec: np.ndarray) -> None:
        row = self.rows.get(fact_id)
        if row is None:
            if self.n == len(self.buf):
                grown = np.empty((2 * len(self.buf), self.buf.shape[1]), dtype=np.float32)
                grown[: self.n] = self.buf[: self.n]
                self.buf = grown
            row = self.n
            self.n += 1
            self.ids.append(fact_id)
            self.rows[fact_id] = row
        self.buf[row] = vec

    def drop(self, fact_id: str) -> None:
        row = self.rows.pop(fact_id, None)
        if row is None:
            return
        last = self.n - 1
        if row != last:  # move the last row into the hole
            moved = self.ids[last]
            self.buf[row] = self.buf[last]
            self.ids[row] = moved
            self.rows[moved] = row
        self.ids.pop()
        self.n = last


class ExactIndex(VectorIndex):
    """Exact in-process search: one float32 matrix per user, thread-safe.

    A query is one matrix-vector product over the user's rows; fine up to some hundred
    thousand facts per user.

    Args:
        dim: Vector dimension; ``None`` takes it from the first upsert.
    """

    def __init__(self, dim: int | None = None) -> None:
        self._dim = dim
        self._users: dict[str, _UserMatrix] = {}
        self._lock = threading.RLock()

    @property
    def dim(self) -> int | None:
        """The vector dimension, or ``None`` before the first upsert."""
        return self._dim

    def upsert(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        ids = check_ids(ids)
        with self._lock:
            if not ids and np.asarray(vectors).size == 0:
                return
            mat = normalize_rows(vectors, self._dim)
            if mat.shape[0] != len(ids):
                raise InvalidInputError(f"{len(ids)} ids but {mat.shape[0]} vectors")
            if self._dim is None:
                self._dim = mat.shape[1]
            user = self._users.get(user_id)
            if user is None:
                user = self._users[user_id] = _UserMatrix(self._dim)
            for fact_id, vec in zip(ids, mat, strict=True):
                user.put(fact_id, vec)

    def remove(self, user_id: str, ids: Sequence[str]) -> None:
        with self._lock:
            user = self._users.get(user_id)
            if user is None:
                return
            for fact_id in ids:
                user.drop(fact_id)
            if user.n == 0:
                del self._users[user_id]

    def clear(self, user_id: str) -> None:
        with self._lock:
            self._users.pop(user_id, None)

    def search(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        k = check_query(vector, k)
        with self._lock:
            user = self._users.get(user_id)
            if user is None or user.n == 0:
                return []
            query = normalize_rows(vector, self._dim)[0]
            scores = user.buf[: user.n] @ query
            return top_k(user.ids, scores, k)

    def count(self, user_id: str) -> int:
        with self._lock:
            user = self._users.get(user_id)
            return 0 if user is None else user.n


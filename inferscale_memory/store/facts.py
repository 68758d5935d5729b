"""The records the fact store hands out: :class:`Fact` and :class:`ScoredFact`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fact:
    """One memory fact of one user, as stored.

    Attributes:
        id: Store-wide unique id (``uuid4().hex``).
        user_id: The user that owns the fact.
        text: The fact text, exactly as added.
        metadata: JSON-serialisable metadata given with the fact (a private copy).
        created_at: Unix time of the add; strictly increasing within one store, so
            sorting by ``(created_at, id)`` gives the order of the adds.
        updated_at: Unix time of the last update (``created_at`` if never updated).
    """

    id: str
    user_id: str
    text: str
    metadata: dict[str, Any]
    created_at: float
    updated_at: float

    def __hash__(self) -> int:  # metadata is a dict, so the generated hash would fail
        return hash((self.id, self.user_id, self.text, self.created_at, self.updated_at))

    def to_dict(self) -> dict[str, Any]:
        """Return the fact as a plain, JSON-serialisable dict (a deep copy).

        Returns:
            A dict with the keys ``id``, ``user_id``, ``text``, ``metadata``,
            ``created_at`` and ``updated_at``.
        """
        return {
            "id": self.id,
            "user_id": self.user_id,
            "text": self.text,
            "metadata": copy.deepcopy(self.metadata),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True)
class ScoredFact:
    """A fact returned by a search, with its cosine similarity to the query.

    Attributes:
        fact: The fact.
        score: Cosine similarity in ``[-1, 1]``; higher is closer.
    """

    fact: Fact
    score: float

    def to_dict(self) -> dict[str, Any]:
        """Return the fact's :meth:`Fact.to_dict` with an added ``score`` key."""
        out = self.fact.to_dict()
        out["score"] = self.score
        return out

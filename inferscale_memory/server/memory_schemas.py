"""Request and response models of the ``/v1/memories`` API.

The user is ``user_id`` in the body or query, or the ``X-Memory-User`` header; a key
bound to exactly one user may leave it out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferscale_memory.fields import FactCount
from inferscale_memory.server.schemas import MAX_K
from inferscale_memory.store import Fact, ScoredFact

MAX_BATCH = 1000
FactText = Annotated[str, Field(min_length=1)]


class Memory(BaseModel):
    """One stored fact (``score`` only in search results)."""

    id: str
    object: Literal["memory"] = "memory"
    user_id: str
    text: str
    metadata: dict[str, Any]
    created_at: float
    updated_at: float
    score: float | None = None

    @classmethod
    def of(cls, fact: Fact | ScoredFact) -> Memory:
        """The API view of a store fact or search hit."""
        if isinstance(fact, ScoredFact):
            return cls(**fact.fact.to_dict(), score=fact.score)
        return cls(**fact.to_dict())


class MemoryList(BaseModel):
    """A list of memories."""

    object: Literal["list"] = "list"
    data: list[Memory]


class AddMemoriesRequest(BaseModel):
    """``POST /v1/memories``: one fact (``text`` a string) or a batch (a list).

    ``metadata`` is one object for every fact, or (for a batch) one object per fact.
    Each fact's KV is captured before the response.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    user_id: str | None = None
    text: FactText | Annotated[list[FactText], Field(min_length=1, max_length=MAX_BATCH)]
    metadata: dict[str, Any] | list[dict[str, Any]] | None = None


class SearchMemoriesRequest(BaseModel):
    """``POST /v1/memories/search``: the user's ``k`` facts closest to ``query``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user_id: str | None = None
    query: str = Field(min_length=1, max_length=65536)
    k: Annotated[FactCount, Field(le=MAX_K)] = 10


class UpdateMemoryRequest(BaseModel):
    """``PUT /v1/memories/{memory_id}``: new text (its KV is recaptured); ``metadata``
    ``null`` keeps the old metadata."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user_id: str | None = None
    text: FactText
    metadata: dict[str, Any] | None = None


class MemoryDeleted(BaseModel):
    """``DELETE /v1/memories/{memory_id}``."""

    id: str
    object: Literal["memory.deleted"] = "memory.deleted"
    deleted: bool = True


class MemoriesDeleted(BaseModel):
    """``DELETE /v1/memories?user_id=...``: every fact of the user."""

    object: Literal["memory.deleted_all"] = "memory.deleted_all"
    user_id: str
    deleted: int


class MemoryEvent(BaseModel):
    """One ADD / UPDATE / DELETE event of a fact."""

    fact_id: str
    user_id: str
    event: str
    old_text: str | None = None
    new_text: str | None = None
    at: float


class MemoryHistory(BaseModel):
    """``GET /v1/memories/{memory_id}/history``."""

    object: Literal["list"] = "list"
    data: list[MemoryEvent]

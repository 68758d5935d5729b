"""``/v1/memories``: add, list, search, get, update, delete one, delete all, history.

Writes await the engine's async memory operations on the engine loop (the store commits
before the KV capture or eviction, and both finish before the response); reads are plain
SQLite and run in a worker thread.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Query, Request

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.server.context import context, request_user
from inferscale_memory.server.errors import ErrorResponseDoc
from inferscale_memory.server.memory_schemas import (
    AddMemoriesRequest,
    MemoriesDeleted,
    Memory,
    MemoryDeleted,
    MemoryEvent,
    MemoryHistory,
    MemoryList,
    SearchMemoriesRequest,
    UpdateMemoryRequest,
)
from inferscale_memory.store.threads import in_store_thread

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/memories", tags=["memories"], responses=ErrorResponseDoc)
UserQuery = Query(None, description="The user (or the X-Memory-User header)")
AllQuery = Query(False, alias="all",
                 description="Must be true: delete-all is never the default of a request")


def _user(request: Request, explicit: str | None) -> str:
    user = request_user(request, explicit, required=True)
    assert user is not None
    return user


def _count(request: Request, op: str) -> None:
    context(request).metrics.memory_ops.labels(op).inc()


@router.post("", response_model=MemoryList, status_code=201, response_model_exclude_none=True)
async def add_memories(body: AddMemoriesRequest, request: Request) -> MemoryList:
    """Add one fact (``text`` a string) or a batch; their KV is captured before the reply."""
    user = _user(request, body.user_id)
    added = await context(request).engine.memory.aadd(body.text, user_id=user,
                                                      metadata=body.metadata)
    _count(request, "add")
    facts = [added] if isinstance(body.text, str) else added
    return MemoryList(data=[Memory.of(fact) for fact in facts])


@router.get("", response_model=MemoryList, response_model_exclude_none=True)
async def list_memories(request: Request, user_id: str | None = UserQuery) -> MemoryList:
    """The user's facts, oldest first (404 for a user who never stored one)."""
    user = _user(request, user_id)
    facts = await in_store_thread(context(request).engine.memory.list, user_id=user)
    return MemoryList(data=[Memory.of(fact) for fact in facts])


@router.delete("", response_model=MemoriesDeleted)
async def delete_all_memories(request: Request, user_id: str | None = UserQuery,
                              everything: bool = AllQuery) -> MemoriesDeleted:
    """Delete every fact of the user (only with ``all=true``); their KV is evicted."""
    user = _user(request, user_id)
    if not everything:
        raise InvalidInputError(
            "deleting all of a user's memories needs all=true "
            "(DELETE /v1/memories?user_id=...&all=true); to delete one memory, "
            "DELETE /v1/memories/{memory_id}")
    count = await context(request).engine.memory.adelete_all(user_id=user)
    _count(request, "delete_all")
    return MemoriesDeleted(user_id=user, deleted=count)


@router.post("/search", response_model=MemoryList, response_model_exclude_none=True)
async def search_memories(body: SearchMemoriesRequest, request: Request) -> MemoryList:
    """The user's ``k`` facts most similar to ``query``, best first, with ``score``."""
    user = _user(request, body.user_id)
    hits: Any = await context(request).engine.memory.asearch(body.query, user_id=user,
                                                             k=body.k)
    return MemoryList(data=[Memory.of(hit) for hit in hits])


@router.get("/{memory_id}", response_model=Memory, response_model_exclude_none=True)
async def get_memory(memory_id: str, request: Request,
                     user_id: str | None = UserQuery) -> Memory:
    """One fact of the user (404 if it does not exist or is another user's)."""
    user = _user(request, user_id)
    return Memory.of(await in_store_thread(context(request).engine.memory.get, memory_id,
                                     user_id=user))


@router.put("/{memory_id}", response_model=Memory, response_model_exclude_none=True)
async def update_memory(memory_id: str, body: UpdateMemoryRequest, request: Request) -> Memory:
    """Replace a fact's text (and metadata, unless null); its KV is recaptured."""
    user = _user(request, body.user_id)
    fact = await context(request).engine.memory.aupdate(memory_id, body.text, user_id=user,
                                                        metadata=body.metadata)
    _count(request, "update")
    return Memory.of(fact)


@router.delete("/{memory_id}", response_model=MemoryDeleted)
async def delete_memory(memory_id: str, request: Request,
                        user_id: str | None = UserQuery) -> MemoryDeleted:
    """Delete one fact; its KV is evicted."""
    user = _user(request, user_id)
    fact = await context(request).engine.memory.adelete(memory_id, user_id=user)
    _count(request, "delete")
    return MemoryDeleted(id=fact.id)


@router.get("/{memory_id}/history", response_model=MemoryHistory)
async def memory_history(memory_id: str, request: Request,
                         user_id: str | None = UserQuery) -> MemoryHistory:
    """The ADD / UPDATE / DELETE events of a fact (kept after its deletion)."""
    user = _user(request, user_id)
    events: list[dict[str, Any]] = await in_store_thread(context(request).engine.memory.history,
                                                   memory_id, user_id=user)
    return MemoryHistory(data=[MemoryEvent(**event) for event in events])

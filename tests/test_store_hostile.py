"""Hostile input to the fact store: every call succeeds or raises a typed error, a refused
call changes nothing, and no call reaches another tenant's facts.

Property tests with the real SQLite file and the real MiniLM embedder. The callers are
two tenants; a third one (the victim) only ever appears through forged fact ids.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile import Draw, arguments, deep
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferscale_memory.errors import (
    FactNotFoundError,
    InferScaleError,
    InvalidInputError,
    UnknownUserError,
)
from inferscale_memory.store import Fact, MemoryStore

CALLERS = ["alice", "bob"]
VICTIM = "victim"
MAX_CHARS = 4000  # the store's default max_fact_chars
CALLS = [
    "add",
    "add",
    "get",
    "list",
    "search",
    "update",
    "update",
    "delete",
    "delete_all",
    "history",
    "has_user",
]
HOSTILE = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemoryStore, list[str]]]:
    from inferscale_memory.embeddings import default_embedder

    path = tmp_path_factory.mktemp("hostile") / "memory.sqlite"
    with MemoryStore(str(path), default_embedder()) as store:
        forged = [
            f.id
            for f in store.add(
                ["The victim's PIN is 8641.", "The victim hides the spare key under the mat."],
                user_id=VICTIM,
            )
        ]
        for user in CALLERS:
            forged += [
                f.id
                for f in store.add([f"{user} likes tea.", f"{user} owns a bike."], user_id=user)
            ]
        yield store, forged


def file_state(store: MemoryStore) -> tuple[Any, ...]:
    """Everything in the file (read on a second connection), plus the index counts."""
    conn = sqlite3.connect(Path(store.path))
    try:
        tables = tuple(
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("facts", "history", "users", "meta")
        )
    finally:
        conn.close()
    counts = tuple(store.index.count(u) for u in [*CALLERS, VICTIM])
    return tables, counts


def listed(store: MemoryStore, user: str) -> list[Fact]:
    return store.list(user_id=user) if store.has_user(user) else []


def calls(
    store: MemoryStore, forged: list[str], data: st.DataObject
) -> tuple[str, Any, Callable[[], Any], str | None]:
    """Draw one call: (name, arguments, thunk, the hostile argument kind or None)."""

    def ids() -> list[str]:
        return forged + [f.id for user in CALLERS for f in listed(store, user)]

    draw = Draw(data, arguments(CALLERS, ids, MAX_CHARS))
    name = data.draw(st.sampled_from(CALLS), "call")
    user = draw("user")
    if name == "add":
        batch = data.draw(st.sampled_from([None, None, 0, 1, 3]), "batch size")
        text = draw("text") if batch is None else [draw("text") for _ in range(batch)]
        per_fact = batch is not None and data.draw(st.booleans(), "metadata per fact")
        meta = [draw("metadata") for _ in range(batch or 0)] if per_fact else draw("metadata")
        if per_fact and draw.hostile != "metadata":  # None is valid alone, not in a list
            meta = [{} if m is None else m for m in meta]
        return (
            name,
            (user, text, meta),
            lambda: store.add(text, user_id=user, metadata=meta),
            draw.hostile,
        )
    if name == "search":
        query, k = draw("query"), draw("k")
        return name, (user, k), lambda: store.search(query, user_id=user, k=k), draw.hostile
    if name in ("list", "delete_all", "has_user"):
        return name, (user,), lambda: getattr(store, name)(user_id=user), draw.hostile
    fid = draw("fact_id")
    if name == "update":
        text, meta = draw("text"), draw("metadata")
        return (
            name,
            (user, fid, text, meta),
            lambda: store.update(fid, text, user_id=user, metadata=meta),
            draw.hostile,
        )
    return name, (user, fid), lambda: getattr(store, name)(fid, user_id=user), draw.hostile


def check_success(store: MemoryStore, name: str, args: tuple, result: Any) -> None:
    """What a call that returned must have done, for its own tenant only."""
    user = args[0]
    if name == "add":
        _, text, meta = args
        facts = [result] if isinstance(text, str) else result
        texts = [text] if isinstance(text, str) else list(text)
        assert [f.text for f in facts] == texts
        for fact in facts:
            assert fact.user_id == user and store.get(fact.id, user_id=user) == fact
            assert isinstance(meta, list) or fact.metadata == (meta or {})
    elif name in ("get", "update", "delete"):
        assert result.user_id == user and result.id == args[1]
        if name == "update":
            assert result.text == args[2] and store.get(args[1], user_id=user) == result
        if name == "delete":
            with pytest.raises(FactNotFoundError):
                store.get(args[1], user_id=user)
    elif name in ("list", "search"):
        assert all(getattr(item, "fact", item).user_id == user for item in result)
        if name == "search":
            assert len(result) <= args[1]
    elif name == "history":
        assert result and all(e["user_id"] == user and e["fact_id"] == args[1] for e in result)
    elif name == "delete_all":
        assert isinstance(result, int) and store.list(user_id=user) == []
    else:
        assert isinstance(result, bool)


@HOSTILE
@given(data=st.data())
def test_hostile_calls_succeed_or_raise_typed_errors_and_change_nothing(
    seeded: tuple[MemoryStore, list[str]], data: st.DataObject
) -> None:
    store, forged = seeded
    before = file_state(store)
    lists_before = {u: listed(store, u) for u in [*CALLERS, VICTIM]}
    name, args, call, hostile = calls(store, forged, data)
    try:
        result = call()
    except InferScaleError as exc:
        event(f"{name}: {type(exc).__name__}")
        if hostile is None:  # valid arguments: at most not found (a forged id)
            assert isinstance(exc, FactNotFoundError | UnknownUserError), exc
        assert file_state(store) == before, f"a refused {name} changed the store"
        assert {u: listed(store, u) for u in lists_before} == lists_before
        return
    except Exception as exc:  # noqa: BLE001 - the property under test
        pytest.fail(f"{name}{args!r:.300} raised {type(exc).__name__}: {exc!s:.300}")
    event(f"{name}: ok")
    assert listed(store, VICTIM) == lists_before[VICTIM], "another tenant's facts changed"
    if name in ("get", "list", "search", "history", "has_user"):
        assert file_state(store) == before, f"the read {name} changed the store"
    check_success(store, name, args, result)


@pytest.mark.parametrize("depth", [99, 100, 101, 600, 980, 5000])
def test_deep_metadata_is_refused_with_a_typed_error(
    seeded: tuple[MemoryStore, list[str]], depth: int
) -> None:
    store, _ = seeded
    before = file_state(store)
    metadata = deep(depth)  # {"deep": [...]} nests depth + 1 levels
    if depth < 100:
        fact = store.add(
            "Deep metadata is fine up to 100 levels.", user_id="alice", metadata=metadata
        )
        assert store.get(fact.id, user_id="alice").metadata == metadata
        store.delete(fact.id, user_id="alice")
        return
    with pytest.raises(InvalidInputError, match="nest"):
        store.add("A fact with metadata nested too deep.", user_id="alice", metadata=metadata)
    assert file_state(store) == before


@pytest.mark.parametrize("bad", ["\ud800", "a\udfffb", "\udc80" * 3])
def test_lone_surrogates_are_invalid_input_everywhere(
    seeded: tuple[MemoryStore, list[str]], bad: str
) -> None:
    store, forged = seeded
    before = file_state(store)
    for call in (
        lambda: store.add(f"fact {bad}", user_id="alice"),
        lambda: store.add(["fine fact", f"fact {bad}"], user_id="alice"),
        lambda: store.add("fine fact", user_id=f"alice{bad}"),
        lambda: store.add("fine fact", user_id="alice", metadata={"k": bad}),
        lambda: store.add("fine fact", user_id="alice", metadata={bad: 1}),
        lambda: store.search(f"query {bad}", user_id="alice", k=3),
        lambda: store.update(forged[2], f"new {bad}", user_id="alice"),
        lambda: store.update(forged[2], "new", user_id="alice", metadata={"k": [bad]}),
        lambda: store.get(bad, user_id="alice"),
        lambda: store.delete(bad, user_id="alice"),
        lambda: store.history(bad, user_id="alice"),
        lambda: store.has_user(bad),
        lambda: store.list(user_id=bad),
    ):
        with pytest.raises(InvalidInputError, match="surrogate"):
            call()
    assert file_state(store) == before

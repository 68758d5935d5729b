"""Hostile input to the fact store: every call succeeds or raises a typed error, a refused
call changes nothing, and no call reaches another user's facts.

Property tests with the real SQLite file (and a real PostgreSQL) and the real MiniLM
embedder. The callers are two users; a third one (the victim) only ever appears through
forged fact ids.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hostile import check_success, deep, draw_call, file_state, listed
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pg_helpers import needs_postgres, new_database

from inferscale_memory.errors import (
    FactNotFoundError,
    InferScaleError,
    InvalidInputError,
    UnknownUserError,
)
from inferscale_memory.store import MemoryStore

CALLERS = ["alice", "bob"]
VICTIM = "victim"
USERS = [*CALLERS, VICTIM]
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


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=needs_postgres)])
def seeded(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemoryStore, list[str]]]:
    from inferscale_memory.embeddings import default_embedder

    path = str(tmp_path_factory.mktemp("hostile") / "memory.sqlite")
    if request.param == "postgres":
        path = new_database(request.getfixturevalue("pg_server"))
    with MemoryStore(path, default_embedder()) as store:
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


@HOSTILE
@given(data=st.data())
def test_hostile_calls_succeed_or_raise_typed_errors_and_change_nothing(
    seeded: tuple[MemoryStore, list[str]], data: st.DataObject
) -> None:
    store, forged = seeded
    before = file_state(store, USERS)
    lists_before = {u: listed(store, u) for u in USERS}
    name, args, call, hostile = draw_call(data, store, store, CALLERS, forged, MAX_CHARS, CALLS)
    try:
        result = call()
    except InferScaleError as exc:
        event(f"{name}: {type(exc).__name__}")
        if hostile is None:  # valid arguments: at most not found (a forged id)
            assert isinstance(exc, FactNotFoundError | UnknownUserError), exc
        assert file_state(store, USERS) == before, f"a refused {name} changed the store"
        assert {u: listed(store, u) for u in lists_before} == lists_before
        return
    except Exception as exc:  # noqa: BLE001 - the property under test
        pytest.fail(f"{name}{args!r:.300} raised {type(exc).__name__}: {exc!s:.300}")
    event(f"{name}: ok")
    assert listed(store, VICTIM) == lists_before[VICTIM], "another user's facts changed"
    if name in ("get", "list", "search", "history", "has_user"):
        assert file_state(store, USERS) == before, f"the read {name} changed the store"
    check_success(store, name, args, result)


@pytest.mark.parametrize("depth", [99, 100, 101, 600, 980, 5000])
def test_deep_metadata_is_refused_with_a_typed_error(
    seeded: tuple[MemoryStore, list[str]], depth: int
) -> None:
    store, _ = seeded
    before = file_state(store, USERS)
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
    assert file_state(store, USERS) == before


@pytest.mark.parametrize("bad", ["\ud800", "a\udfffb", "\udc80" * 3])
def test_lone_surrogates_are_invalid_input_everywhere(
    seeded: tuple[MemoryStore, list[str]], bad: str
) -> None:
    store, forged = seeded
    before = file_state(store, USERS)
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
    assert file_state(store, USERS) == before

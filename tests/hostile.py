"""Hypothesis strategies of valid and hostile arguments, for the store and engine tests.

:func:`arguments` gives, per argument kind, a strategy that is valid or hostile as asked;
a test draws which argument of a call is hostile (or none, so that calls also succeed
and change state). Hostile values: lone surrogates, NUL and other control characters,
huge strings, wrong types, forged ids, deep or non-JSON metadata, bad ``k``.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import strategies as st

from inferscale_memory.errors import FactNotFoundError

if TYPE_CHECKING:
    from inferscale_memory.store import Fact, MemoryStore

# Every character, lone surrogates included (st.text() leaves them out by default).
ANY_CHAR = st.characters(exclude_categories=())
NASTY = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\u2028",
    "\ufeff",
    "\u202e",
    "\U0001f600" * 3,
    "\u2063INFERSCALE_MEMORY\u2063",
    "'; DROP TABLE facts; --",
    "%s%n",
    "\\",
    '"',
    "../../etc/passwd",
]
NOT_STR = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.just(object()),
)


def any_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Short strings of any characters, plus the nasty ones."""
    return st.one_of(st.text(ANY_CHAR, max_size=max_size), st.sampled_from(NASTY))


def deep(depth: int, leaf: Any = 1) -> dict[str, Any]:
    """Metadata ``{"deep": ...}`` with ``depth`` nested lists and dicts under the top."""
    value = leaf
    for i in range(depth):
        value = {"d": value} if i % 2 else [value]
    return {"deep": value}


def json_values(chars: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """JSON values whose strings are drawn from ``chars``."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(chars, max_size=10),
    )
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(st.text(chars, max_size=5), children, max_size=3),
        ),
        max_leaves=8,
    )


SENTENCE = st.from_regex(r"[A-Z][a-z]{2,9} (likes|owns|visited) [a-z]{3,12}\.", fullmatch=True)


def arguments(
    users: list[str], fact_ids: Callable[[], list[str]], max_chars: int
) -> dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]:
    """``{kind: (valid, hostile)}`` strategies of each argument kind.

    Args:
        users: The valid user ids.
        fact_ids: Returns real fact ids (of these users and of others) when called:
            "valid" fact ids, which a call may still not be allowed to reach. Called at
            draw time (the ids change as calls add and delete facts), so ids are drawn
            as an index: hypothesis replays a draw only if its choices stay the same.
        max_chars: The store's longest fact.
    """
    bad_user = st.one_of(
        any_text().filter(lambda u: u not in users),
        NOT_STR,
        st.sampled_from(["u" * 128, "u" * 129, "u" * 100_000, "user\n", "user\x7f"]),
    )
    good_text = st.one_of(
        SENTENCE, st.text(min_size=1, max_size=60).filter(str.strip), st.just("y" * max_chars)
    )
    bad_text = st.one_of(
        any_text(60),
        NOT_STR,
        st.sampled_from([" " * 5, "\t\n", "y" * (max_chars + 1), "z" * 1_000_000]),
    )
    bad_fact_id = st.one_of(
        st.text("0123456789abcdef", min_size=32, max_size=32),
        any_text(),
        NOT_STR,
        st.sampled_from(["0" * 32, "%", "*", "' OR 1=1 --", "x" * 100_000]),
    )
    bad_k = st.one_of(
        st.integers(max_value=0),
        st.just(10**30),
        st.sampled_from([True, False, 2.0, 1.5, math.nan, math.inf, "3", None]),
    )
    good_metadata = st.one_of(
        st.none(), st.dictionaries(st.text(max_size=8), json_values(st.characters()), max_size=4)
    )
    bad_metadata = st.one_of(
        st.dictionaries(st.text(ANY_CHAR, max_size=8), json_values(ANY_CHAR), max_size=4),
        NOT_STR,
        st.sampled_from(
            [
                {"t": (1, 2)},
                {"s": {1, 2}},
                {1: "int key"},
                {"nan": math.nan},
                {"inf": -math.inf},
                {"b": b"bytes"},
                {"big": 10**40},
                {"o": object()},
                {"x": "y" * 70_000},
                deep(20),
                deep(99),
                deep(150),
            ]
        ),
    )
    return {
        "user": (st.sampled_from(users), bad_user),
        "text": (good_text, bad_text),
        "query": (st.one_of(SENTENCE, st.just("q" * 100_000)), bad_text),
        "fact_id": (st.integers(0, 1 << 16).map(lambda i: _pick(fact_ids(), i)), bad_fact_id),
        "k": (st.integers(min_value=1, max_value=20), bad_k),
        "metadata": (good_metadata, bad_metadata),
    }


def _pick(ids: list[str], index: int) -> str:
    return ids[index % len(ids)]


class Draw:
    """Draws the arguments of one call, hostile only for ``hostile`` (one kind or none)."""

    def __init__(
        self,
        data: st.DataObject,
        strategies: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]],
    ) -> None:
        self._data = data
        self._strategies = strategies
        self.hostile = data.draw(st.sampled_from((None, *strategies)), "hostile argument")

    def __call__(self, kind: str) -> Any:
        good, bad = self._strategies[kind]
        return self._data.draw(bad if kind == self.hostile else good, kind)


def file_state(store: MemoryStore, users: list[str]) -> tuple[Any, ...]:
    """Everything in the store's file (read on a second connection), plus index counts."""
    if store.path.startswith("postgresql://"):  # the tests' URLs hold no password
        import psycopg

        with psycopg.connect(store.path) as pg:
            tables = tuple(
                tuple(pg.execute(f"SELECT row_t::text FROM {table} row_t ORDER BY 1").fetchall())
                for table in ("facts", "history", "users", "meta")
            )
        return tables, tuple(store.index.count(u) for u in users)
    conn = sqlite3.connect(store.path)
    try:
        tables = tuple(
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("facts", "history", "users", "meta")
        )
    finally:
        conn.close()
    return tables, tuple(store.index.count(u) for u in users)


def listed(store: MemoryStore, user: str) -> list[Fact]:
    """``store.list`` of a user, ``[]`` for a user who never stored a fact."""
    return store.list(user_id=user) if store.has_user(user) else []


def draw_call(
    data: st.DataObject,
    api: Any,
    store: MemoryStore,
    callers: list[str],
    forged: list[str],
    max_chars: int,
    names: list[str],
) -> tuple[str, Any, Callable[[], Any], str | None]:
    """Draw one call of the fact API ``api`` (a store, or an engine's ``memory``).

    Returns:
        (name, arguments, thunk, the hostile argument kind or None).
    """

    def ids() -> list[str]:
        return forged + [f.id for user in callers for f in listed(store, user)]

    draw = Draw(data, arguments(callers, ids, max_chars))
    name = data.draw(st.sampled_from(names), "call")
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
            lambda: api.add(text, user_id=user, metadata=meta),
            draw.hostile,
        )
    if name == "search":
        query, k = draw("query"), draw("k")
        return name, (user, k), lambda: api.search(query, user_id=user, k=k), draw.hostile
    if name in ("list", "delete_all", "has_user"):
        return name, (user,), lambda: getattr(api, name)(user_id=user), draw.hostile
    fid = draw("fact_id")
    if name == "update":
        text, meta = draw("text"), draw("metadata")
        return (
            name,
            (user, fid, text, meta),
            lambda: api.update(fid, text, user_id=user, metadata=meta),
            draw.hostile,
        )
    return name, (user, fid), lambda: getattr(api, name)(fid, user_id=user), draw.hostile


def check_success(store: MemoryStore, name: str, args: tuple[Any, ...], result: Any) -> None:
    """What a call that returned must have done, for its own user only."""
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

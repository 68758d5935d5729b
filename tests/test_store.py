"""Tests of the durable fact store: real SQLite files, the real default embedder."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import itertools
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pg_helpers import needs_postgres, new_database

from inferscale_memory.errors import (
    FactNotFoundError,
    InferScaleError,
    InvalidInputError,
    StoreError,
    UnknownUserError,
)
from inferscale_memory.store import ExactIndex, Fact, MemoryStore, ScoredFact, VectorIndex

REPO = Path(__file__).resolve().parents[1]

needs_qdrant = pytest.mark.skipif(importlib.util.find_spec("qdrant_client") is None,
                                  reason="needs qdrant-client (the qdrant extra)")


@contextlib.contextmanager
def exact_index() -> Iterator[VectorIndex]:
    yield ExactIndex()


@contextlib.contextmanager
def qdrant_memory_index() -> Iterator[VectorIndex]:
    from inferscale_memory.store.qdrant import QdrantIndex

    index = QdrantIndex(":memory:")
    try:
        yield index
    finally:
        index.close()


@contextlib.contextmanager
def qdrant_path_index() -> Iterator[VectorIndex]:
    from inferscale_memory.store.qdrant import QdrantIndex

    with tempfile.TemporaryDirectory() as folder:
        index = QdrantIndex(folder)
        try:
            yield index
        finally:
            index.close()


# Every VectorIndex backend runs the same index and store tests.
INDEX_BACKENDS = [
    pytest.param(exact_index, id="exact"),
    pytest.param(qdrant_memory_index, id="qdrant-memory", marks=needs_qdrant),
    pytest.param(qdrant_path_index, id="qdrant-path", marks=needs_qdrant),
]

CAROLINE_FACTS = [
    "Caroline moved to Berlin in May 2023.",
    "Caroline is learning to play the guitar.",
    "Melanie has two kids and loves camping.",
    "Caroline's favourite food is sushi.",
    "The team meeting is scheduled for Tuesday.",
]


@pytest.fixture(scope="module")
def embedder():
    from inferscale_memory.embeddings import default_embedder

    return default_embedder()


# The store tests run over SQLite with every index, and over PostgreSQL (pgvector search).
STORE_BACKENDS = [
    *INDEX_BACKENDS,
    pytest.param("postgres", id="postgres", marks=needs_postgres),
    pytest.param("postgres-hnsw", id="postgres-hnsw", marks=needs_postgres),
]


@pytest.fixture(params=STORE_BACKENDS)
def store(request, tmp_path, embedder):
    if isinstance(request.param, str):
        url = new_database(request.getfixturevalue("pg_server"))
        with MemoryStore(url, embedder, hnsw=request.param.endswith("hnsw")) as s:
            yield s
        return
    with request.param() as index, MemoryStore(str(tmp_path / "memory.sqlite"), embedder,
                                               index) as s:
        yield s


def snapshot(store: MemoryStore) -> tuple:
    """Everything observable about a store, to check that a failed call changed nothing."""
    users = store.users()
    facts = {u: [f.to_dict() for f in store.list(user_id=u)] for u in users}
    history = {u: [store.history(f["id"], user_id=u) for f in fs] for u, fs in facts.items()}
    counts = {u: store.index.count(u) for u in users}
    return users, facts, history, counts


# --------------------------------------------------------------------------- basics


def test_add_get_list(store):
    fact = store.add(
        "Caroline moved to Berlin in May 2023.",
        user_id="caroline",
        metadata={"source": "chat", "turn": 3, "tags": ["move"]},
    )
    assert isinstance(fact, Fact)
    assert re.fullmatch(r"[0-9a-f]{32}", fact.id)
    assert fact.user_id == "caroline"
    assert fact.metadata == {"source": "chat", "turn": 3, "tags": ["move"]}
    assert fact.created_at == fact.updated_at
    assert store.get(fact.id, user_id="caroline") == fact
    assert len({fact, store.get(fact.id, user_id="caroline")}) == 1  # hashable
    more = store.add(["Caroline likes pottery.", "Caroline has a dog."], user_id="caroline")
    assert [f.text for f in more] == ["Caroline likes pottery.", "Caroline has a dog."]
    listed = store.list(user_id="caroline")
    assert listed == [fact, *more]  # add order, by (created_at, id)
    assert [f.created_at for f in listed] == sorted(f.created_at for f in listed)
    assert fact.to_dict()["metadata"] == fact.metadata
    assert store.users() == ["caroline"] and store.has_user("caroline")
    assert store.index.count("caroline") == 3
    assert store.history(fact.id, user_id="caroline")[0]["event"] == "ADD"
    assert store.add([], user_id="nobody") == [] and not store.has_user("nobody")


def test_search_ranks_the_berlin_fact_first(store):
    facts = store.add(CAROLINE_FACTS, user_id="caroline")
    hits = store.search("Where does Caroline live?", user_id="caroline", k=3)
    assert len(hits) == 3 and all(isinstance(h, ScoredFact) for h in hits)
    assert hits[0].fact.id == facts[0].id
    assert "Berlin" in hits[0].fact.text
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0 + 1e-6 for s in scores)
    everything = store.search("Where does Caroline live?", user_id="caroline", k=50)
    assert len(everything) == len(CAROLINE_FACTS)
    exact = store.search(CAROLINE_FACTS[3], user_id="caroline", k=1)[0]
    assert exact.fact.id == facts[3].id and exact.score == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("k", [2**63, 10**30])
def test_search_with_a_k_beyond_any_database_integer_returns_every_fact(store, k):
    # A k no SQL integer holds (PostgreSQL's LIMIT is a bigint) still means "all of them".
    store.add(CAROLINE_FACTS, user_id="caroline")
    hits = store.search("Where does Caroline live?", user_id="caroline", k=k)
    assert len(hits) == len(CAROLINE_FACTS)
    assert "Berlin" in hits[0].fact.text


def test_neighbours_are_the_nearest_other_facts_in_add_order_by_stored_embeddings(
        store, embedder, monkeypatch):
    """A capture's context (memory.contexts): per fact, its k nearest other facts, oldest
    first, found by the fact's stored embedding (no text embedded again) and, for a fact
    of another store, by its text (all such facts in one call)."""
    facts = store.add(CAROLINE_FACTS, user_id="caroline")
    embedded: list[list[str]] = []
    embed = embedder.embed

    def counting(texts):
        embedded.append(list(texts))
        return embed(texts)

    monkeypatch.setattr(embedder, "embed", counting)
    foreign = Fact("f" * 32, "caroline", "Caroline lives in Berlin now.", {}, 0.0, 0.0)
    near = store.neighbours([facts[0], facts[3], foreign], user_id="caroline", k=2)
    assert embedded == [[foreign.text]]
    order = {f.id: i for i, f in enumerate(facts)}
    for fact, got in zip([facts[0], facts[3], foreign], near, strict=True):
        hits = [h.fact for h in store.search(fact.text, user_id="caroline", k=3)]
        want = [f for f in hits if f.id != fact.id][:2]
        assert [f.id for f in got] == sorted((f.id for f in want), key=order.__getitem__)
    assert facts[0] in near[2]  # the Berlin fact is the foreign Berlin fact's neighbour
    assert all(facts[0] not in got for got in near[:1])  # never its own neighbour
    assert store.neighbours([], user_id="caroline", k=2) == []
    with pytest.raises(UnknownUserError):
        store.neighbours([facts[0]], user_id="nobody", k=2)
    with pytest.raises(InvalidInputError):
        store.neighbours([facts[0]], user_id="caroline", k=0)


def test_neighbours_in_similarity_order_put_the_nearest_fact_last(store):
    """``order="similarity"``: the same neighbours as the add order, least similar first,
    so that the nearest sits right before the fact in its capture prompt."""
    facts = store.add(CAROLINE_FACTS, user_id="caroline")
    by_added = store.neighbours(facts, user_id="caroline", k=3)
    by_similarity = store.neighbours(facts, user_id="caroline", k=3, order="similarity")
    for fact, added, near in zip(facts, by_added, by_similarity, strict=True):
        hits = [h.fact for h in store.search(fact.text, user_id="caroline", k=4)]
        want = [f for f in hits if f.id != fact.id][:3]
        assert [f.id for f in near] == [f.id for f in reversed(want)]
        assert {f.id for f in near} == {f.id for f in added}
    assert any([f.id for f in a] != [f.id for f in b]
               for a, b in zip(by_added, by_similarity, strict=True))
    with pytest.raises(InvalidInputError):
        store.neighbours(facts[:1], user_id="caroline", k=2, order="recent")


def test_facts_read_by_id_cost_the_same_whatever_the_user_holds(tmp_path):
    """A search's hits (every chat's retrieval) and a capture's neighbours are read by
    primary key: SQLite's work for 5 ids, counted in virtual-machine steps (no clock), is
    the same with 5,000 facts held as with 50. Before, the owner test chose the user's
    index and read every row of the user."""
    from inferscale_memory.store.sqlite import FactDB

    def steps_per_read(held: int) -> tuple[int, int]:
        db = FactDB(tmp_path / f"held{held}.sqlite")
        facts = [Fact(f"{i:032x}", "u", f"fact {i}", {}, float(i), float(i))
                 for i in range(held)]
        with db.transaction() as tx:
            tx.insert(facts, np.ones((held, 4), np.float32) / 2)
        ids = [f.id for f in facts[::held // 5]][:5]
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        conn = db._connection()
        conn.set_progress_handler(count, 1)
        assert list(db.get_many("u", ids)) == ids and db.get_many("other", ids) == {}
        facts_steps = steps[0]
        steps[0] = 0
        assert sorted(db.embeddings_of("u", ids, 4)) == sorted(ids)
        conn.set_progress_handler(None, 1)
        db.close()
        return facts_steps, steps[0]

    few, many = steps_per_read(50), steps_per_read(5_000)
    assert many[0] < 1.5 * few[0] and many[1] < 1.5 * few[1], (few, many)


def test_memory_path_and_parent_folders(tmp_path, embedder):
    with MemoryStore(":memory:", embedder) as s:
        s.add("Caroline moved to Berlin.", user_id="c")
        assert len(s.list(user_id="c")) == 1
    deep = tmp_path / "a" / "b" / "c" / "store.sqlite"
    with MemoryStore(str(deep), embedder) as s:
        s.add("x marks the spot", user_id="c")
    assert deep.exists()
    with sqlite3.connect(deep) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1


# --------------------------------------------------------------------------- writes


@pytest.mark.parametrize(
    ("texts", "metadata"),
    [
        (["good fact", "   "], None),
        (["good fact", None], None),
        (["good fact", "x" * 4001], None),
        (["good fact", "other fact"], [{"a": 1}, {"b": float("nan")}]),
        (["good fact", "other fact"], [{"a": 1}]),
        (["good fact", "other fact"], {"bad": object()}),
    ],
)
def test_batch_add_is_atomic(store, texts, metadata):
    store.add("Caroline moved to Berlin.", user_id="caroline")
    before = snapshot(store)
    for user in ("caroline", "newcomer"):
        with pytest.raises(InvalidInputError):
            store.add(texts, user_id=user, metadata=metadata)
    assert snapshot(store) == before
    assert not store.has_user("newcomer")


def test_update_changes_text_embedding_and_history(store):
    fact = store.add("Caroline moved to Berlin in May 2023.", user_id="caroline", metadata={"v": 1})
    store.add(CAROLINE_FACTS[1:], user_id="caroline")
    new_text = "Caroline adopted a cat named Luna."
    updated = store.update(fact.id, new_text, user_id="caroline")
    assert updated.id == fact.id and updated.text == new_text
    assert updated.metadata == {"v": 1}  # metadata=None keeps it
    assert updated.created_at == fact.created_at and updated.updated_at > fact.updated_at
    assert store.get(fact.id, user_id="caroline") == updated
    # The embedding followed the text.
    top = store.search(new_text, user_id="caroline", k=1)[0]
    assert top.fact.id == fact.id and top.score == pytest.approx(1.0, abs=1e-4)
    old = store.search(fact.text, user_id="caroline", k=10)
    assert all(h.score < 0.99 for h in old)
    assert store.search("What pet does Caroline have?", user_id="caroline", k=1)[0].fact.id == (
        fact.id
    )
    again = store.update(fact.id, "Caroline has a cat.", user_id="caroline", metadata={"v": 2})
    assert again.metadata == {"v": 2}
    events = store.history(fact.id, user_id="caroline")
    assert [e["event"] for e in events] == ["ADD", "UPDATE", "UPDATE"]
    assert events[1]["old_text"] == fact.text and events[1]["new_text"] == new_text
    assert events[2]["old_text"] == new_text and events[2]["new_text"] == "Caroline has a cat."
    assert store.index.count("caroline") == len(CAROLINE_FACTS)


def test_delete_removes_everywhere(store):
    facts = store.add(CAROLINE_FACTS, user_id="caroline")
    gone = store.delete(facts[0].id, user_id="caroline")
    assert gone == facts[0]
    with pytest.raises(FactNotFoundError):
        store.get(facts[0].id, user_id="caroline")
    assert facts[0].id not in [f.id for f in store.list(user_id="caroline")]
    hits = store.search("Where does Caroline live?", user_id="caroline", k=10)
    assert facts[0].id not in [h.fact.id for h in hits] and len(hits) == len(facts) - 1
    with pytest.raises(FactNotFoundError):
        store.delete(facts[0].id, user_id="caroline")
    with pytest.raises(FactNotFoundError):
        store.update(facts[0].id, "back again", user_id="caroline")
    events = store.history(facts[0].id, user_id="caroline")  # kept after the delete
    assert [e["event"] for e in events] == ["ADD", "DELETE"]
    assert events[1]["old_text"] == facts[0].text and events[1]["new_text"] is None


def test_delete_all(store):
    store.add(CAROLINE_FACTS, user_id="caroline")
    kept = store.add("Bob lives in Rome.", user_id="bob")
    assert store.delete_all(user_id="caroline") == len(CAROLINE_FACTS)
    assert store.list(user_id="caroline") == []
    assert store.search("Berlin", user_id="caroline", k=5) == []
    assert store.has_user("caroline") and store.index.count("caroline") == 0
    assert store.delete_all(user_id="caroline") == 0
    assert store.list(user_id="bob") == [kept]
    store.add("Caroline is back.", user_id="caroline")
    assert len(store.list(user_id="caroline")) == 1


def test_unknown_user(store):
    store.add("Caroline moved to Berlin.", user_id="caroline")
    assert not store.has_user("ghost")
    for call in (
        lambda: store.list(user_id="ghost"),
        lambda: store.search("anything", user_id="ghost", k=3),
        lambda: store.delete_all(user_id="ghost"),
    ):
        with pytest.raises(UnknownUserError, match="add facts"):
            call()
    with pytest.raises(FactNotFoundError):
        store.get("0" * 32, user_id="ghost")


# --------------------------------------------------------------------------- users


def test_user_isolation(store):
    a = store.add("Alice's bank PIN is 4321.", user_id="alice")
    b = store.add("Bob likes hiking.", user_id="bob")
    before = snapshot(store)
    missing = "f" * 32
    for call in (
        lambda fid: store.get(fid, user_id="bob"),
        lambda fid: store.update(fid, "hijacked", user_id="bob"),
        lambda fid: store.delete(fid, user_id="bob"),
        lambda fid: store.history(fid, user_id="bob"),
    ):
        with pytest.raises(FactNotFoundError) as foreign:
            call(a.id)
        with pytest.raises(FactNotFoundError) as unknown:
            call(missing)
        # Same message either way: nothing tells B that the id exists.
        assert str(foreign.value).replace(a.id, "<id>") == str(unknown.value).replace(
            missing, "<id>"
        )
        assert "alice" not in str(foreign.value)
    assert snapshot(store) == before
    hits = store.search("Alice's bank PIN is 4321.", user_id="bob", k=10)
    assert [h.fact.id for h in hits] == [b.id]
    assert store.get(a.id, user_id="alice") == a


# --------------------------------------------------------------------------- validation


BAD_CALLS = {
    "empty user": lambda s, fid: s.add("fact", user_id=""),
    "long user": lambda s, fid: s.add("fact", user_id="u" * 129),
    "control char user": lambda s, fid: s.add("fact", user_id="a\nb"),
    "non-str user": lambda s, fid: s.add("fact", user_id=7),
    "empty text": lambda s, fid: s.add("", user_id="u"),
    "blank text": lambda s, fid: s.add(" \n\t ", user_id="u"),
    "bytes text": lambda s, fid: s.add(b"fact", user_id="u"),
    "non-str text": lambda s, fid: s.add(42, user_id="u"),
    "long text": lambda s, fid: s.add("x" * 4001, user_id="u"),
    "int key metadata": lambda s, fid: s.add("fact", user_id="u", metadata={1: "x"}),
    "tuple metadata": lambda s, fid: s.add("fact", user_id="u", metadata={"t": (1, 2)}),
    "nan metadata": lambda s, fid: s.add("fact", user_id="u", metadata={"x": float("inf")}),
    "list metadata for one": lambda s, fid: s.add("fact", user_id="u", metadata=[{}]),
    "str metadata": lambda s, fid: s.add("fact", user_id="u", metadata="meta"),
    "k zero": lambda s, fid: s.search("q", user_id="u", k=0),
    "k negative": lambda s, fid: s.search("q", user_id="u", k=-1),
    "k float": lambda s, fid: s.search("q", user_id="u", k=1.5),
    "k bool": lambda s, fid: s.search("q", user_id="u", k=True),
    "k str": lambda s, fid: s.search("q", user_id="u", k="3"),
    "blank query": lambda s, fid: s.search("  ", user_id="u", k=3),
    "blank update": lambda s, fid: s.update(fid, "", user_id="u"),
    "long update": lambda s, fid: s.update(fid, "y" * 4001, user_id="u"),
    "bad update metadata": lambda s, fid: s.update(fid, "ok", user_id="u", metadata={"s": {1}}),
    "non-str fact id": lambda s, fid: s.get(123, user_id="u"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_raises_typed_error_and_changes_nothing(store, name):
    fact = store.add("Caroline moved to Berlin.", user_id="u")
    before = snapshot(store)
    with pytest.raises(InvalidInputError):
        BAD_CALLS[name](store, fact.id)
    assert snapshot(store) == before


def test_constructor_and_file_errors(tmp_path, embedder):
    with pytest.raises(InvalidInputError):
        MemoryStore(":memory:", embedder, max_fact_chars=0)
    with pytest.raises(InvalidInputError):
        MemoryStore(":memory:", object())
    not_a_db = tmp_path / "junk.sqlite"
    not_a_db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError):
        MemoryStore(str(not_a_db), embedder)

    path = str(tmp_path / "m.sqlite")
    with MemoryStore(path, embedder) as s:
        s.add("Caroline moved to Berlin.", user_id="c")

    class OtherDim:  # never embeds: the dimension check comes first
        dim = embedder.dim + 1

        def embed(self, texts):
            raise AssertionError("must not be called")

    with pytest.raises(StoreError, match="dimension"):
        MemoryStore(path, OtherDim())
    s = MemoryStore(path, embedder)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.list(user_id="c")
    with pytest.raises(StoreError):
        s.add("more", user_id="c")
    assert issubclass(StoreError, InferScaleError)


def test_small_max_fact_chars(tmp_path, embedder):
    with MemoryStore(str(tmp_path / "m.sqlite"), embedder, max_fact_chars=10) as s:
        s.add("0123456789", user_id="u")
        with pytest.raises(InvalidInputError, match="at most 10"):
            s.add("0123456789a", user_id="u")


# --------------------------------------------------------------------------- restart


@needs_postgres
def test_two_stores_on_one_database_see_each_others_writes_at_once(pg_url, embedder):
    """Two replicas' stores: no in-process copy, so every commit is visible to both."""
    with MemoryStore(pg_url, embedder) as a, MemoryStore(pg_url, embedder) as b:
        fact = a.add("Caroline moved to Berlin in May 2023.", user_id="caroline")
        a.add("Caroline likes sushi.", user_id="caroline")
        assert b.search("Where does Caroline live?", user_id="caroline", k=1)[0].fact == fact
        new = b.update(fact.id, "Caroline moved to Oslo in June 2024.", user_id="caroline")
        hit = a.search("Where does Caroline live?", user_id="caroline", k=1)[0].fact
        assert hit == new and a.get(fact.id, user_id="caroline").text == new.text
        a.delete(fact.id, user_id="caroline")
        hits = b.search("Where does Caroline live?", user_id="caroline", k=5)
        assert fact.id not in [h.fact.id for h in hits] and len(hits) == 1
        assert [e["event"] for e in b.history(fact.id, user_id="caroline")] == [
            "ADD", "UPDATE", "DELETE"]


@needs_postgres
def test_replicas_opening_a_new_database_at_once_all_open(pg_server):
    """Replicas that open a new database at the same moment: each one creates pgvector and
    migrates the schema, one at a time (``CREATE EXTENSION IF NOT EXISTS`` outside the
    migration's lock failed one of two with a duplicate key)."""
    from inferscale_memory.store.postgres import PostgresFactDB

    for _ in range(4):  # a race: several fresh databases, several openers each
        url = new_database(pg_server)
        start = threading.Barrier(4)
        errors: list[BaseException] = []
        opened: list[PostgresFactDB] = []

        def open_one(url: str = url, start: threading.Barrier = start,
                     opened: list[PostgresFactDB] = opened,
                     errors: list[BaseException] = errors) -> None:
            start.wait()
            try:
                opened.append(PostgresFactDB(url, pool_size=1))
            except BaseException as exc:  # noqa: BLE001 - what the opener raised, asserted below
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for db in opened:
            db.close()
        assert errors == []


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=needs_postgres)])
def test_reopen_keeps_everything(tmp_path, embedder, backend, request):
    path = str(tmp_path / "memory.sqlite")
    if backend == "postgres":
        path = new_database(request.getfixturevalue("pg_server"))
    s = MemoryStore(path, embedder)
    facts = s.add(CAROLINE_FACTS, user_id="caroline", metadata=[{"i": i} for i in range(5)])
    bob = s.add("Bob lives in Rome.", user_id="bob")
    s.update(facts[1].id, "Caroline is learning to play the piano.", user_id="caroline")
    s.delete(facts[4].id, user_id="caroline")
    before = snapshot(s)
    hits_before = s.search("Where does Caroline live?", user_id="caroline", k=4)
    s.close()

    with MemoryStore(path, embedder) as s2:
        assert snapshot(s2) == before
        assert s2.users() == ["bob", "caroline"]
        hits = s2.search("Where does Caroline live?", user_id="caroline", k=4)
        assert [h.fact.id for h in hits] == [h.fact.id for h in hits_before]
        assert [h.score for h in hits] == pytest.approx([h.score for h in hits_before])
        assert hits[0].fact.id == facts[0].id
        assert s2.get(bob.id, user_id="bob") == bob
        later = s2.add("Caroline got a new job.", user_id="caroline")
        assert s2.list(user_id="caroline")[-1] == later  # order continues after a restart
        assert later.created_at > max(e["at"] for evs in before[2]["caroline"] for e in evs)


class CheapEmbedder:
    """Deterministic hashing embedder for the kill -9 writer (the test is about SQLite)."""

    dim = 32

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                h = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
                out[row, h % self.dim] += 1.0
            out[row, 0] += 0.5
        return out / np.linalg.norm(out, axis=1, keepdims=True)


WRITER = """
import hashlib, sys
import numpy as np
sys.path.insert(0, {repo!r})
from inferscale_memory.store import MemoryStore

{embedder}

store = MemoryStore(sys.argv[1], CheapEmbedder())
print("READY", flush=True)
i = 0
while True:
    fact = store.add(f"fact number {{i}} " + "lorem ipsum " * 40, user_id="writer",
                     metadata={{"i": i}})
    print(fact.id, i, flush=True)
    i += 1
"""


def test_acknowledged_adds_survive_kill_9(tmp_path):
    path = str(tmp_path / "durable.sqlite")
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(repo=str(REPO), embedder=inspect.getsource(CheapEmbedder)))
    err_path = tmp_path / "writer.err"
    err_file = err_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, str(script), path],
        stdout=subprocess.PIPE,
        stderr=err_file,
        text=True,
        cwd=str(tmp_path),
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    acked: dict[str, int] = {}
    try:
        first = lines.get(timeout=300)
        assert first == "READY\n", f"writer failed: {first!r} {err_path.read_text()}"
        while len(acked) < 25:
            line = lines.get(timeout=60)
            assert line is not None, err_path.read_text()
            fid, i = line.split()
            acked[fid] = int(i)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        err_file.close()
    assert proc.returncode == -signal.SIGKILL
    # Lines already in the pipe were acknowledged before the kill, too.
    while (line := lines.get(timeout=60)) is not None:
        if line.endswith("\n"):
            fid, i = line.split()
            acked[fid] = int(i)
    proc.stdout.close()

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute("SELECT id, text, metadata, length(embedding) FROM facts").fetchall()
        adds = conn.execute("SELECT fact_id FROM history WHERE event = 'ADD'").fetchall()
    conn.close()
    assert sorted(r[0] for r in rows) == sorted(a[0] for a in adds)  # no half-written add
    assert all(r[3] == 4 * CheapEmbedder.dim for r in rows)

    with MemoryStore(path, CheapEmbedder()) as s:
        stored = {f.id: f for f in s.list(user_id="writer")}
        assert set(acked) <= set(stored), "an acknowledged add was lost"
        assert len(stored) <= len(acked) + 1  # at most the one in flight at the kill
        indices = sorted(f.metadata["i"] for f in stored.values())
        assert indices == list(range(len(stored)))
        for fid, i in acked.items():
            assert stored[fid].text.startswith(f"fact number {i} ")
        assert s.index.count("writer") == len(stored)
        top = s.search(stored[next(iter(acked))].text, user_id="writer", k=1)[0]
        assert top.score == pytest.approx(1.0, abs=1e-5)
        s.add("written after the crash", user_id="writer")


# --------------------------------------------------------------------------- threads


def test_concurrent_writers_and_readers(store):
    store.add("seed fact about Berlin", user_id="t0")
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            user = f"t{n % 2}"
            for j in range(6):
                f = store.add(f"thread {n} fact {j} about Berlin", user_id=user)
                assert store.get(f.id, user_id=user) == f
                store.search("Berlin", user_id=user, k=3)
                if j % 3 == 2:
                    store.delete(f.id, user_id=user)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    total = sum(len(store.list(user_id=u)) for u in ("t0", "t1"))
    assert total == 1 + 6 * 4
    for u in ("t0", "t1"):
        assert store.index.count(u) == len(store.list(user_id=u))


# --------------------------------------------------------------------------- index


@pytest.fixture(params=INDEX_BACKENDS)
def make_index(request):
    """A factory of fresh indexes of one backend, closed after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(request.param())



def test_index_basics(make_index):
    index: VectorIndex = make_index()
    eye = np.eye(4, dtype=np.float32)
    index.upsert("a", ["x", "y", "z"], eye[:3] * 5.0)  # normalised by the index
    index.upsert("b", ["x"], eye[3:4])
    assert index.count("a") == 3 and index.count("b") == 1 and index.count("nobody") == 0
    hits = index.search("a", eye[1], k=2)
    assert hits[0] == ("y", pytest.approx(1.0))
    assert len(hits) == 2
    assert [i for i, _ in index.search("b", eye[1], k=5)] == ["x"]  # per-user namespaces
    index.upsert("a", ["y"], eye[3:4])  # replace
    assert index.count("a") == 3 and index.search("a", eye[3], k=1)[0][0] == "y"
    index.remove("a", ["y", "missing"])
    assert index.count("a") == 2 and "y" not in [i for i, _ in index.search("a", eye[3], k=5)]
    index.clear("a")
    assert index.count("a") == 0 and index.search("a", eye[0], k=3) == []
    assert index.search("nobody", eye[0], k=3) == []
    assert index.count("b") == 1


def test_index_ties_broken_by_id(make_index):
    index = make_index()
    e = np.eye(3, dtype=np.float32)
    index.upsert("u", ["c", "a", "d", "b"], np.stack([e[0], e[0], e[1], e[0]]))
    assert [i for i, _ in index.search("u", e[0], k=4)] == ["a", "b", "c", "d"]
    assert [i for i, _ in index.search("u", e[0], k=2)] == ["a", "b"]


@pytest.mark.parametrize(
    ("ids", "vectors"),
    [
        (["a", "b"], np.ones((1, 3))),
        (["a", "a"], np.ones((2, 3))),
        (["a"], np.zeros((1, 3))),
        (["a"], np.array([[np.nan, 1.0, 0.0]])),
        ([""], np.ones((1, 3))),
    ],
)
def test_index_rejects_bad_vectors(make_index, ids, vectors):
    index = make_index()
    with pytest.raises(InvalidInputError):
        index.upsert("u", ids, vectors)
    assert index.count("u") == 0


def test_index_rejects_bad_k_and_dim(make_index):
    index = make_index()
    index.upsert("u", ["a"], np.ones((1, 3)))
    for k in (0, -2, 1.5, True):
        with pytest.raises(InvalidInputError):
            index.search("u", np.ones(3), k=k)
    with pytest.raises(InvalidInputError):
        index.upsert("u", ["b"], np.ones((1, 4)))
    with pytest.raises(InvalidInputError):
        index.search("u", np.ones(4), k=1)


def test_index_user_filtering(make_index):
    """Same ids and vectors under many users: every call sees and changes one user only."""
    index = make_index()
    e = np.eye(4, dtype=np.float32)
    users = ["alice", "bob", "Alice", "alice ", "al", "a"]
    for n, user in enumerate(users, start=1):
        index.upsert(user, [f"f{j}" for j in range(n)], np.tile(e[0], (n, 1)))
    # ("a", "lf0") and ("al", "f0") must not be one point, whatever the id encoding.
    index.upsert("a", ["lf0"], e[1:2])
    for n, user in enumerate(users, start=1):
        extra = 1 if user == "a" else 0
        assert index.count(user) == n + extra
        assert len(index.search(user, e[0], k=50)) == n + extra
    index.remove("bob", ["f0", "f1"])
    index.clear("alice")
    index.remove("al", ["lf0"])  # an id of another user: nothing happens
    assert [index.count(u) for u in users] == [0, 0, 3, 4, 5, 7]
    assert index.search("alice", e[0], k=5) == []
    assert [i for i, _ in index.search("a", e[1], k=1)] == ["lf0"]
    assert [i for i, _ in index.search("al", e[0], k=2)] == ["f0", "f1"]
    index.replace("Alice", ["f9"], e[2:3])
    assert index.count("Alice") == 1 and index.count("alice ") == 4


def test_index_tie_group_larger_than_k(make_index):
    """A tie at the k-th score is broken by id over the whole tie group."""
    index = make_index()
    e = np.eye(3, dtype=np.float32)
    ids = [f"t{j:02d}" for j in range(40)]
    rng = np.random.default_rng(0)
    order = rng.permutation(40)
    index.upsert("u", [ids[j] for j in order], np.tile(e[0], (40, 1)))
    index.upsert("u", ["best", "worse"], np.stack([e[0] + 0.0, e[0] + e[1]]))
    hits = index.search("u", e[0], k=10)
    assert [i for i, _ in hits] == ["best", *ids[:9]]  # all 41 tie: by id
    assert all(score == pytest.approx(1.0) for _, score in hits)
    assert [i for i, _ in index.search("u", e[0], k=41)] == ["best", *ids]
    assert index.search("u", e[0], k=42)[-1][0] == "worse"


def test_index_replace_and_reload(make_index):
    index = make_index()
    e = np.eye(4, dtype=np.float32)
    index.upsert("u", ["a", "b", "c"], e[:3])
    index.upsert("v", ["a"], e[:1])
    index.replace("u", ["b", "c", "d"], np.stack([e[1], e[0], e[3]]))  # c changed, a gone
    assert index.count("u") == 3 and index.count("v") == 1
    assert index.search("u", e[0], k=1)[0] == ("c", pytest.approx(1.0))
    assert "a" not in [i for i, _ in index.search("u", e[0], k=5)]
    index.replace("u", [], np.empty((0, 4)))
    assert index.count("u") == 0 and index.count("v") == 1


def test_index_concurrent_writers_and_readers(make_index):
    index = make_index()
    rng = np.random.default_rng(1)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for j in range(20):
                index.upsert(f"u{n % 2}", [f"{n}-{j}"], rng.standard_normal((1, 8)))
                index.search(f"u{n % 2}", np.ones(8), k=3)
                if j % 4 == 3:
                    index.remove(f"u{n % 2}", [f"{n}-{j}"])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert index.count("u0") == index.count("u1") == 2 * 15
    assert len(index.search("u0", np.ones(8), k=100)) == 30


def check_top_k_matches_brute_force(index, data, n, dim, k):
    coords = st.integers(-3, 3)
    rows = data.draw(
        st.lists(st.lists(coords, min_size=dim, max_size=dim).filter(any), min_size=n, max_size=n)
    )
    query = data.draw(st.lists(coords, min_size=dim, max_size=dim).filter(any))
    removed = data.draw(st.sets(st.integers(0, n - 1), max_size=n // 3))
    ids = [f"id{j:03d}" for j in data.draw(st.permutations(range(n)))]
    index.upsert("u", ids, np.array(rows, dtype=np.float32))
    index.remove("u", [ids[j] for j in removed])

    mat = np.array(rows, dtype=np.float64)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    q = np.array(query, dtype=np.float64) / np.linalg.norm(query)
    brute = {ids[j]: float(mat[j] @ q) for j in range(n) if j not in removed}
    expected = sorted(brute, key=lambda i: (-brute[i], i))[:k]

    got = index.search("u", np.array(query, dtype=np.float32), k=k)
    got_ids = [i for i, _ in got]
    assert len(got) == len(expected)
    for (i, score), (j, next_score) in itertools.pairwise(got):  # best first, ties by id
        assert score > next_score or (score == next_score and i < j)
    for i, score in got:
        assert score == pytest.approx(brute[i], abs=1e-5)
    cutoff = min(brute[i] for i in got_ids)
    assert all(brute[i] <= cutoff + 1e-5 for i in brute if i not in got_ids)
    # Where no two scores are close, the answer is exactly the brute-force order.
    values = sorted(brute.values())
    if all(b - a > 1e-4 for a, b in itertools.pairwise(values)):
        assert got_ids == expected


PROPERTY = dict(data=st.data(), n=st.integers(1, 40), dim=st.integers(1, 6), k=st.integers(1, 50))


@pytest.mark.parametrize("backend", INDEX_BACKENDS[:2])
@settings(max_examples=150, deadline=None, database=None)
@given(**PROPERTY)
def test_index_top_k_matches_brute_force(backend, data, n, dim, k):
    with backend() as index:
        check_top_k_matches_brute_force(index, data, n, dim, k)


@needs_qdrant
@settings(max_examples=20, deadline=None, database=None)  # a folder per example is slow
@given(**PROPERTY)
def test_qdrant_path_index_top_k_matches_brute_force(data, n, dim, k):
    with qdrant_path_index() as index:
        check_top_k_matches_brute_force(index, data, n, dim, k)

"""The Qdrant index with the store: restart, reconciliation, shared use, config, migration.

The backend-independent index and store tests run on Qdrant in tests/test_store.py; these
are the behaviours only a persistent, shareable index has. Real SQLite files, the real
default embedder, qdrant-client's embedded mode (a Qdrant server cannot run here).
"""

from __future__ import annotations

import socket
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from inferscale_memory import MemoryConfig
from inferscale_memory.cli import main
from inferscale_memory.errors import (
    ConfigError,
    MissingDependencyError,
    StoreError,
    UnknownUserError,
)
from inferscale_memory.store import ExactIndex, MemoryStore, open_index

pytest.importorskip("qdrant_client")

from inferscale_memory.bench.index import format_table, run_index_bench  # noqa: E402
from inferscale_memory.store.qdrant import QdrantIndex  # noqa: E402

FACTS = [
    "Caroline moved to Berlin in May 2023.",
    "Caroline is learning to play the guitar.",
    "Caroline's favourite food is sushi.",
    "The team meeting is scheduled for Tuesday.",
]


@pytest.fixture(scope="module")
def embedder():
    from inferscale_memory.embeddings import default_embedder

    return default_embedder()


def qdrant_config(tmp_path: Path, **extra: object) -> MemoryConfig:
    return MemoryConfig.load(store_path=str(tmp_path / "memory.sqlite"), index="qdrant",
                             **extra)


def file_vectors(path: Path, user_id: str) -> tuple[list[str], np.ndarray]:
    """A user's ids and embeddings, read straight from the SQLite file."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT id, embedding FROM facts WHERE user_id = ?",
                            (user_id,)).fetchall()
    conn.close()
    return [r[0] for r in rows], np.array([np.frombuffer(r[1], "<f4") for r in rows])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- restart


def test_restart_with_a_persistent_qdrant_folder(tmp_path, embedder):
    config = qdrant_config(tmp_path)
    store = MemoryStore.from_config(config, embedder)
    assert isinstance(store.index, QdrantIndex)
    assert store.index.location == str(tmp_path / "memory.sqlite") + ".qdrant"
    facts = store.add(FACTS, user_id="caroline")
    store.add("Bob lives in Rome.", user_id="bob")
    store.update(facts[1].id, "Caroline is learning to play the piano.", user_id="caroline")
    store.delete(facts[3].id, user_id="caroline")
    before = store.search("Where does Caroline live?", user_id="caroline", k=3)
    store.close()

    with MemoryStore.from_config(config, embedder) as again:
        assert again.index.count("caroline") == 3 and again.index.count("bob") == 1  # no double
        hits = again.search("Where does Caroline live?", user_id="caroline", k=3)
        assert [h.fact.id for h in hits] == [h.fact.id for h in before]
        assert [h.score for h in hits] == pytest.approx([h.score for h in before], abs=1e-5)
        top = again.search("Caroline plays the piano", user_id="caroline", k=1)[0]
        assert top.fact.id == facts[1].id

    # The collection equals the file: syncing it against the file changes nothing.
    index = QdrantIndex(config.resolved_qdrant_path)
    try:
        for user in ("caroline", "bob"):
            stats = index.sync(user, *file_vectors(tmp_path / "memory.sqlite", user))
            assert (stats.written, stats.removed) == (0, 0)
    finally:
        index.close()


def test_reopen_reconciles_a_stale_collection(tmp_path, embedder):
    config = qdrant_config(tmp_path)
    with MemoryStore.from_config(config, embedder) as store:
        facts = store.add(FACTS, user_id="caroline")
        store.add("Bob lives in Rome.", user_id="bob")
    # The file changes while the collection is not in use...
    with MemoryStore(config.resolved_store_path, embedder) as exact:
        assert isinstance(exact.index, ExactIndex)
        exact.delete(facts[0].id, user_id="caroline")
        exact.update(facts[1].id, "Caroline adopted a cat named Luna.", user_id="caroline")
        exact.add("Dana collects stamps.", user_id="dana")
    # ...and the collection gets points the file never had.
    index = QdrantIndex(config.resolved_qdrant_path)
    index.upsert("caroline", ["ghost"], embedder.embed(["Caroline moved to Berlin."]))
    index.upsert("zed", ["z1"], np.ones((1, embedder.dim)))
    index.close()

    with MemoryStore.from_config(config, embedder) as store:
        for user in ("caroline", "bob", "dana"):
            assert store.index.count(user) == len(store.list(user_id=user))
        ids = [h.fact.id for h in store.search("Berlin", user_id="caroline", k=10)]
        assert facts[0].id not in ids and len(ids) == 3
        assert [i for i, _ in store.index.search("caroline", embedder.embed(["x"])[0], 10)
                if i == "ghost"] == []
        cat = store.search("Caroline adopted a cat named Luna.", user_id="caroline", k=1)[0]
        assert cat.fact.id == facts[1].id and cat.score == pytest.approx(1.0, abs=1e-4)
        assert store.search("stamps", user_id="dana", k=1)[0].fact.text == "Dana collects stamps."
        # A user the file does not know stays in the collection but is never served.
        assert store.index.count("zed") == 1
        with pytest.raises(UnknownUserError):
            store.search("anything", user_id="zed", k=1)


def test_replicas_share_a_store_file_and_a_qdrant_index(tmp_path, embedder):
    """Two stores on one file with one shared index see each other's writes; stale hits go."""
    shared = QdrantIndex(":memory:")
    path = str(tmp_path / "memory.sqlite")
    try:
        with MemoryStore(path, embedder, shared) as a, MemoryStore(path, embedder, shared) as b:
            facts = a.add(FACTS, user_id="caroline")
            assert b.search("Where does Caroline live?", user_id="caroline", k=1)[0].fact == \
                facts[0]
            b.delete(facts[0].id, user_id="caroline")
            assert facts[0].id not in [h.fact.id for h in a.search("Berlin", user_id="caroline",
                                                                   k=4)]
            # A point whose fact is gone (a stale shared index) is dropped, and k is filled.
            shared.upsert("caroline", ["stale"], embedder.embed(["Where is the meeting?"]))
            hits = a.search("Where is the meeting?", user_id="caroline", k=3)
            assert len(hits) == 3 and shared.count("caroline") == 3
    finally:
        shared.close()


# --------------------------------------------------------------------------- config


def test_config_selects_and_opens_the_index(tmp_path, embedder, monkeypatch):
    with MemoryStore.from_config(MemoryConfig.load(store_path=":memory:"), embedder) as store:
        assert isinstance(store.index, ExactIndex)
    memory = MemoryConfig.load(store_path=":memory:", index="qdrant")
    with MemoryStore.from_config(memory, embedder) as store:
        assert isinstance(store.index, QdrantIndex) and store.index.location == ":memory:"
        store.add("Caroline moved to Berlin.", user_id="c")
        assert store.index.count("c") == 1

    monkeypatch.setenv("INFERSCALE_INDEX", "qdrant")
    monkeypatch.setenv("INFERSCALE_QDRANT_PATH", str(tmp_path / "q"))
    monkeypatch.setenv("INFERSCALE_QDRANT_COLLECTION", "team_a")
    config = MemoryConfig.load(store_path=str(tmp_path / "a.sqlite"))
    with MemoryStore.from_config(config, embedder) as store:
        assert (store.index.location, store.index.collection) == (str(tmp_path / "q"), "team_a")
        store.add("Caroline moved to Berlin.", user_id="c")
        # Embedded Qdrant serves one process: a second opener gets a clear error.
        with pytest.raises(StoreError, match="qdrant_url"):
            MemoryStore.from_config(config, embedder)
        assert store.search("Berlin", user_id="c", k=1)[0].fact.text.startswith("Caroline")


# qdrant-client warns, rightly, of an API key sent over plain HTTP (this test's closed
# local port); attributed to the store that makes the client, it would be an error here.
@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection:UserWarning")
def test_unreachable_qdrant_server_fails_before_the_store_is_touched(tmp_path, embedder):
    config = qdrant_config(tmp_path, qdrant_url=f"http://127.0.0.1:{closed_port()}",
                           qdrant_api_key="secret-key")
    with pytest.raises(StoreError, match="127.0.0.1") as caught:
        MemoryStore.from_config(config, embedder)
    assert "secret-key" not in str(caught.value)
    assert not (tmp_path / "memory.sqlite").exists()


def test_missing_qdrant_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "qdrant_client", None)  # as if it were not installed
    with pytest.raises(MissingDependencyError, match=r"inferscale-memory\[qdrant\]"):
        QdrantIndex(":memory:")
    with pytest.raises(MissingDependencyError):
        open_index(MemoryConfig.load(store_path=":memory:", index="qdrant"))


def test_collection_of_another_shape_is_refused(tmp_path):
    QdrantIndex(tmp_path / "q", dim=3).close()
    with pytest.raises(ConfigError, match="size 3"):
        QdrantIndex(tmp_path / "q", dim=4)
    index = QdrantIndex(tmp_path / "q")  # the dimension comes from the collection
    assert index.dim == 3
    with pytest.raises(ConfigError):
        QdrantIndex(tmp_path / "other", url="http://localhost:6333")
    index.close()
    index.close()  # idempotent


# --------------------------------------------------------------------------- migration


def test_migrate_index_command(tmp_path, embedder, capsys):
    path = tmp_path / "memory.sqlite"
    qpath = tmp_path / "q"
    with MemoryStore(str(path), embedder) as store:
        facts = store.add(FACTS, user_id="caroline")
        store.add(["Bob lives in Rome.", "Bob has a dog."], user_id="bob")
        store.delete(facts[3].id, user_id="caroline")
    command = ["migrate-index", "--to", "qdrant", "--store", str(path), "--qdrant-path", str(qpath)]

    assert main(command) == 0
    assert "5 facts of 2 users" in capsys.readouterr().out
    index = QdrantIndex(qpath)
    assert index.count("caroline") == 3 and index.count("bob") == 2
    top = index.search("caroline", embedder.embed([FACTS[2]])[0], k=1)[0]
    assert top[0] == facts[2].id and top[1] == pytest.approx(1.0, abs=1e-5)
    index.close()

    assert main(command) == 0  # idempotent
    assert "0 written, 0 removed, 5 already current" in capsys.readouterr().out
    with MemoryStore(str(path), embedder) as store:
        store.delete(facts[0].id, user_id="caroline")
    assert main(command) == 0
    assert "0 written, 1 removed, 4 already current" in capsys.readouterr().out

    config = MemoryConfig.load(store_path=str(path), index="qdrant", qdrant_path=str(qpath))
    with MemoryStore.from_config(config, embedder) as store:
        assert store.search("sushi", user_id="caroline", k=1)[0].fact.id == facts[2].id


def test_migrate_index_errors(tmp_path, capsys):
    missing = tmp_path / "missing.sqlite"
    assert main(["migrate-index", "--to", "qdrant", "--store", str(missing)]) == 2
    assert "no fact store" in capsys.readouterr().err
    assert not missing.exists()
    assert main(["migrate-index", "--to", "qdrant", "--store", str(missing),
                 "--qdrant-api-key", "k"]) == 2
    assert "qdrant_api_key needs qdrant_url" in capsys.readouterr().err


# --------------------------------------------------------------------------- bench


def test_bench_index_runs_every_backend(capsys):
    rows = run_index_bench([200], dim=16, queries=4, k=5)
    assert [r.backend for r in rows] == ["exact", "qdrant-memory", "qdrant-path"]
    assert all(r.facts == 200 and r.same_as_exact == 1.0 for r in rows)
    assert format_table(rows).count("\n") == len(rows) + 1
    assert main(["bench", "index", "--facts", "100", "--queries", "2", "--dim", "8",
                 "--backends", "exact,qdrant-memory"]) == 0
    assert "| qdrant-memory | 100 |" in capsys.readouterr().out

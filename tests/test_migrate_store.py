"""``inferscale-memory migrate-store --to postgres``: a SQLite store copied into a real
PostgreSQL, wholly and idempotently; and ``bench index``'s store backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from durability_writer import HashEmbedder
from pg_helpers import needs_postgres

from inferscale_memory.cli import main
from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import StoreError
from inferscale_memory.store import MemoryStore
from inferscale_memory.store.migrate import migrate_to_postgres

pytestmark = needs_postgres


def everything(store: MemoryStore) -> dict:
    """All a user of the store can observe, per user: facts, history, one search's order."""
    out = {}
    for user in store.users():
        facts = store.list(user_id=user) if store.has_user(user) else []
        hits = store.search("alpha bravo", user_id=user, k=50) if facts else []
        out[user] = ([f.to_dict() for f in facts],
                     {f.id: store.history(f.id, user_id=user) for f in facts},
                     [h.fact.id for h in hits])
    return out


def test_migrate_store_copies_everything_and_is_idempotent(tmp_path: Path, pg_url: str,
                                                          capsys: pytest.CaptureFixture) -> None:
    path = str(tmp_path / "memory.sqlite")
    with MemoryStore(path, HashEmbedder()) as store:
        a = store.add(["alpha bravo one", "charlie \x00 delta two", "echo three"],
                      user_id="ann", metadata={"nul": "a\x00b", "n": [1, 2.5]})
        store.add("alpha foxtrot", user_id="bob")
        store.update(a[0].id, "alpha bravo one, changed", user_id="ann", metadata={"v": 2})
        gone = store.delete(a[2].id, user_id="ann")
        store.add("carol's only fact", user_id="carol")
        store.delete_all(user_id="carol")  # a user with no facts left stays known
        want = everything(store)
        gone_history = store.history(gone.id, user_id="ann")

    argv = ["migrate-store", "--to", "postgres", "--store", path, "--postgres-url", pg_url]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "3 facts of 3 users" in first and "3 written" in first and "8 history" in first
    with MemoryStore(pg_url, HashEmbedder()) as copied:
        assert everything(copied) == want
        assert copied.history(gone.id, user_id="ann") == gone_history
        assert copied.counts() == (3, 3)

    assert main(argv) == 0  # again: nothing to do
    second = capsys.readouterr().out
    assert "0 written, 0 removed, 3 already current, 0 history events copied" in second

    with MemoryStore(path, HashEmbedder()) as store:  # the file moves on; so does the copy
        store.delete(a[1].id, user_id="ann")
        store.update(a[0].id, "alpha bravo, third text", user_id="ann")
        want = everything(store)
    config = MemoryConfig.load(store="postgres", store_path=path, postgres_url=pg_url)
    report = migrate_to_postgres(config)
    assert (report.written, report.removed, report.unchanged, report.events) == (1, 1, 1, 2)
    with MemoryStore(pg_url, HashEmbedder()) as copied:
        assert everything(copied) == want


def test_migrate_store_refuses_a_target_of_another_dimension(tmp_path: Path,
                                                            pg_url: str) -> None:
    class Wide(HashEmbedder):
        dim = 96

    with MemoryStore(pg_url, Wide()) as target:
        target.add("written with 96 dimensions", user_id="ann")
        before = target.counts()
    path = str(tmp_path / "memory.sqlite")
    with MemoryStore(path, HashEmbedder()) as store:
        store.add("written with 64 dimensions", user_id="bob")
    config = MemoryConfig.load(store="postgres", store_path=path, postgres_url=pg_url)
    with pytest.raises(StoreError, match="dimension 96"):
        migrate_to_postgres(config)
    with MemoryStore(pg_url, Wide()) as target:  # all or nothing: bob was not copied
        assert target.counts() == before and not target.has_user("bob")


def test_bench_index_store_backends(pg_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale_memory.bench.index import run_index_bench

    monkeypatch.setenv("INFERSCALE_POSTGRES_URL", pg_server)  # a schema of its own, dropped
    rows = run_index_bench([300], ["exact", "sqlite", "postgres", "postgres-hnsw"], dim=16,
                           users=3, queries=4, k=5)
    assert [r.backend for r in rows] == ["exact", "sqlite", "postgres", "postgres-hnsw"]
    assert all(r.facts == 300 and r.build_s > 0 for r in rows)
    assert [r.same_as_exact for r in rows[:3]] == [1.0, 1.0, 1.0]  # exact searches agree

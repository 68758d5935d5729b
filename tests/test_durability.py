"""Durability of the fact store under process crashes: a writer is killed with SIGKILL
again and again in the middle of its writes.

After every kill the file must hold exactly the acknowledged writes, plus (all or
nothing) the one write in flight: every acknowledged add present, every acknowledged
delete gone, every acknowledged update visible, each fact's embedding that of its text,
its history consistent, and the index rebuilt from the file equal to a brute-force
search over the file. The crash model is a process crash (kill -9), not a power loss.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from durability_writer import USERS, HashEmbedder
from pg_helpers import needs_postgres, new_database, wait_for_other_sessions

from inferscale_memory.store import MemoryStore

REPO = Path(__file__).resolve().parents[1]
WRITER = Path(__file__).with_name("durability_writer.py")
SEED = 20240817
KILLS = 16  # writer generations, each killed at a random moment


@dataclass
class Model:
    """What the store must hold: the acknowledged writes."""

    facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> user/text/metadata
    events: Counter[str] = field(default_factory=Counter)  # id -> number of history events
    deleted: set[str] = field(default_factory=set)

    def apply(self, op: dict[str, Any], result: Any) -> None:
        if op["kind"] == "add":
            for fid, text, meta in zip(result, op["texts"], op["metadata"], strict=True):
                self.facts[fid] = {"user": op["user"], "text": text, "metadata": meta}
                self.events[fid] += 1
        elif op["kind"] == "update":
            fact = self.facts[op["id"]]
            fact["text"] = op["text"]
            if op["metadata"] is not None:
                fact["metadata"] = op["metadata"]
            self.events[op["id"]] += 1
        else:
            ids = ([op["id"]] if op["kind"] == "delete" else
                   [fid for fid, f in self.facts.items() if f["user"] == op["user"]])
            for fid in ids:
                del self.facts[fid]
                self.deleted.add(fid)
                self.events[fid] += 1


def run_writer(path: Path, generation: int, delay_s: float, log: Path) -> list[dict]:
    """Start a writer, SIGKILL it ``delay_s`` after it is ready; return its full lines."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(path), str(SEED), str(generation)],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(REPO),
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            first = lines.get(timeout=120)
            assert first == json.dumps({"ready": generation}) + "\n", (first, log.read_text())
            time.sleep(delay_s)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, log.read_text()
    out = []
    while (line := lines.get(timeout=60)) is not None:
        if line.endswith("\n"):  # a torn last line counts as not written
            out.append(json.loads(line))
    assert proc.stdout is not None
    proc.stdout.close()
    return out


def replay(model: Model, messages: list[dict]) -> dict[str, Any] | None:
    """Apply the acknowledged ops to ``model``; return the op in flight at the kill."""
    in_flight = None
    for message in messages:
        if "begin" in message:
            in_flight = message["begin"]
        else:
            assert in_flight is not None, message
            model.apply(in_flight, message["ack"])
            in_flight = None
    return in_flight


def read_file(path: Path | str) -> tuple[dict[str, dict[str, Any]], dict[str, list[tuple]]]:
    """Rows of the file: facts by id (with the raw embedding) and history by fact id."""
    if isinstance(path, str):
        return read_database(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        facts = {r[0]: {"user": r[1], "text": r[2], "metadata": json.loads(r[3]),
                        "embedding": r[4]}
                 for r in conn.execute(
                     "SELECT id, user_id, text, metadata, embedding FROM facts")}
        history: dict[str, list[tuple]] = {}
        for fid, user, event, old, new in conn.execute(
                "SELECT fact_id, user_id, event, old_text, new_text FROM history ORDER BY seq"):
            history.setdefault(fid, []).append((user, event, old, new))
        users = {r[0] for r in conn.execute("SELECT user_id FROM users")}
    finally:
        conn.close()
    assert {f["user"] for f in facts.values()} <= users
    return facts, history


def read_database(url: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[tuple]]]:
    """:func:`read_file` of a PostgreSQL store, read with psycopg rather than the store,
    once the killed writer's sessions have ended (its write in flight is decided then)."""
    import psycopg

    wait_for_other_sessions(url)

    with psycopg.connect(url) as conn:
        facts = {r[0]: {"user": r[1], "text": _utf8(r[2]), "metadata": r[3],
                        "embedding": np.array(json.loads(r[4]), dtype="<f4").tobytes()}
                 for r in conn.execute(
                     "SELECT id, user_id, text, metadata, embedding::text FROM facts")}
        history: dict[str, list[tuple]] = {}
        for fid, user, event, old, new in conn.execute(
                "SELECT fact_id, user_id, event, old_text, new_text FROM history ORDER BY seq"):
            history.setdefault(fid, []).append((user, event, _utf8(old), _utf8(new)))
        users = {r[0] for r in conn.execute("SELECT user_id FROM users")}
    assert {f["user"] for f in facts.values()} <= users
    return facts, history


def _utf8(value: bytes | None) -> str | None:
    """A text column of the PostgreSQL store (UTF-8 bytes, see store/postgres.py)."""
    return None if value is None else bytes(value).decode("utf-8")


def resolve_in_flight(model: Model, op: dict[str, Any] | None,
                      facts: dict[str, dict[str, Any]]) -> str:
    """Decide whether the write in flight committed (wholly) and fold it into ``model``.

    Returns ``"none"``, ``"committed"`` or ``"lost"``; fails on a partial write.
    """
    if op is None:
        return "none"
    if op["kind"] == "add":
        new = sorted(fid for fid in facts if fid not in model.facts)
        if not new:
            return "lost"
        assert len(new) == len(op["texts"]), f"half an add batch committed: {new}"
        by_text = {facts[fid]["text"]: fid for fid in new}
        assert sorted(by_text) == sorted(op["texts"]), "unknown facts appeared"
        model.apply(op, [by_text[text] for text in op["texts"]])
        return "committed"
    if op["kind"] == "update":
        row = facts.get(op["id"])
        assert row is not None, "an update deleted its fact"
        if row["text"] == model.facts[op["id"]]["text"]:
            return "lost"
        model.apply(op, op["id"])
        return "committed"
    targets = ([op["id"]] if op["kind"] == "delete" else
               [fid for fid, f in model.facts.items() if f["user"] == op["user"]])
    present = [fid in facts for fid in targets]
    assert all(present) or not any(present), "half a delete_all committed"
    if all(present):
        return "lost"
    model.apply(op, None)
    return "committed"


def check_history(model: Model, history: dict[str, list[tuple]]) -> None:
    assert set(history) == set(model.events), "history of a fact nobody acknowledged"
    for fid, events in history.items():
        assert len(events) == model.events[fid], (fid, events)
        assert events[0][1] == "ADD" and events[0][2] is None
        for before, after in zip(events, events[1:], strict=False):
            assert after[2] == before[3], f"history of {fid} does not chain"
        assert all(e[0] == events[0][0] for e in events)
        if fid in model.deleted:
            assert events[-1][1] == "DELETE" and events[-1][3] is None
        else:
            assert events[-1][1] in ("ADD", "UPDATE")
            assert events[-1][3] == model.facts[fid]["text"]


def check_file(model: Model, facts: dict[str, dict[str, Any]]) -> None:
    assert set(facts) == set(model.facts), "acknowledged facts missing or deleted ones back"
    embedder = HashEmbedder()
    for fid, row in facts.items():
        want = model.facts[fid]
        assert (row["user"], row["text"], row["metadata"]) == (
            want["user"], want["text"], want["metadata"]), fid
        vector = np.frombuffer(row["embedding"], dtype="<f4")
        np.testing.assert_allclose(vector, embedder.embed([row["text"]])[0], atol=1e-6)


def check_reopened_index(path: Path | str, model: Model, rng: random.Random) -> None:
    """The index rebuilt on open equals a brute-force search over the acknowledged facts."""
    embedder = HashEmbedder()
    with MemoryStore(str(path), embedder) as store:
        for user in USERS:
            ids = sorted(fid for fid, f in model.facts.items() if f["user"] == user)
            if not store.has_user(user):
                assert not ids
                continue
            assert sorted(f.id for f in store.list(user_id=user)) == ids
            assert store.index.count(user) == len(ids)
            if not ids:
                continue
            query = model.facts[rng.choice(ids)]["text"]
            hits = store.search(query, user_id=user, k=len(ids) + 5)
            matrix = embedder.embed([model.facts[fid]["text"] for fid in ids])
            scores = matrix @ embedder.embed([query])[0]
            assert sorted(h.fact.id for h in hits) == ids
            assert hits[0].fact.text == query and hits[0].score == pytest.approx(1.0, abs=1e-5)
            expected = dict(zip(ids, scores.tolist(), strict=True))
            for hit in hits:
                assert hit.score == pytest.approx(expected[hit.fact.id], abs=1e-5)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=needs_postgres)])
def test_acknowledged_writes_survive_repeated_kill_9(tmp_path: Path, backend: str,
                                                    request: pytest.FixtureRequest) -> None:
    path: Path | str = tmp_path / "durable.sqlite"
    if backend == "postgres":  # the writer is a client of the session's server
        path = new_database(request.getfixturevalue("pg_server"))
    rng = random.Random(SEED)
    model = Model()
    outcomes: Counter[str] = Counter()
    acks = 0
    for generation in range(KILLS):
        delay = rng.choice((0.0, 0.001, 0.01)) + rng.uniform(0.0, 0.35)
        if backend == "postgres":  # a write is a few round trips to the server, not a file
            delay *= 4
        messages = run_writer(path, generation, delay, tmp_path / f"writer{generation}.err")
        acks += sum("ack" in m for m in messages)
        in_flight = replay(model, messages)
        facts, history = read_file(path)
        outcomes[resolve_in_flight(model, in_flight, facts)] += 1
        check_file(model, facts)
        check_history(model, history)
        check_reopened_index(path, model, rng)
    # The test must actually have exercised crashes in the middle of the writes.
    assert acks >= 10 * KILLS, acks
    assert outcomes["none"] + outcomes["committed"] + outcomes["lost"] == KILLS
    assert outcomes["lost"] + outcomes["committed"] >= KILLS // 2, outcomes
    assert len(model.deleted) > 0 and len(model.facts) > 0
    with MemoryStore(str(path), HashEmbedder()) as store:  # still writable
        store.add("written after the last crash", user_id=USERS[0])


def test_store_runs_sqlite_in_wal_mode_with_full_sync(tmp_path: Path) -> None:
    """kill -9 only needs the commit in the OS; a power cut needs the WAL fsynced at every
    commit (synchronous=FULL). This pins the settings the docs promise."""
    with MemoryStore(str(tmp_path / "m.sqlite"), HashEmbedder()) as store:
        conn = store._db._conn  # the store's own connection: synchronous is per connection
        assert conn is not None
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


@needs_postgres
def test_postgres_store_commits_wait_for_the_disk(pg_url: str) -> None:
    """A server (or database) that defaults to synchronous_commit=off acknowledges commits
    it may lose in a crash; the store's connections turn it back on."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
    with MemoryStore(pg_url, HashEmbedder()) as store:
        assert store._db._all("SHOW synchronous_commit") == [("on",)]
        assert store._db._all("SHOW fsync") == [("on",)]

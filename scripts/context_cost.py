"""Cost of one capture's context (``EngineMemory.contexts``) as a user's facts grow.

A micro-benchmark run by hand, never a test: a SQLite store with the in-process exact
index holds N facts of one user, and each trial finds the ``capture_context`` (4)
neighbours of one fact, as an ``add`` does before its capture. ``--old`` times the way of
before 2026-12-05 (the user's whole timeline listed, the fact's text embedded again and
searched); the default times :meth:`MemoryStore.neighbours`. The embedder is a
deterministic hashing stand-in, so the numbers are the store's work alone; MiniLM's
embedding of one fact, which the old way paid on top, is printed beside them.

Run: ``.venv/bin/python scripts/context_cost.py [--facts 1000,10000] [--trials 50]``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from inferscale_memory.store import MemoryStore

DIM = 384


class HashEmbedder:
    """Unit vectors seeded by each text's hash: fast, deterministic, no model."""

    dim = DIM

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8],
                                                     "little")).standard_normal(DIM)
                for t in texts]
        out = np.asarray(rows, dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def old_context(store: MemoryStore, fact, count: int) -> list[str]:
    timeline = store.list(user_id=fact.user_id)
    position = {f.id: i for i, f in enumerate(timeline)}
    found = store.search(fact.text, user_id=fact.user_id, k=count + 1)
    near = [s.fact for s in found if s.fact.id != fact.id][:count]
    return [f.text for f in sorted(near, key=lambda f: position.get(f.id, 0))]


def new_context(store: MemoryStore, fact, count: int) -> list[str]:
    return [f.text for f in store.neighbours([fact], user_id=fact.user_id, k=count)[0]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--facts", default="1000,10000")
    parser.add_argument("--trials", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for n in (int(x) for x in args.facts.split(",")):
            with MemoryStore(str(Path(folder) / f"s{n}.sqlite"), HashEmbedder()) as store:
                facts = store.add([f"Fact number {i} about the user's day {i % 97}."
                                   for i in range(n)], user_id="u")
                probes = [facts[i] for i in range(0, n, max(1, n // args.trials))]
                for name, way in (("old", old_context), ("new", new_context)):
                    times = []
                    for fact in probes:
                        start = time.perf_counter()
                        way(store, fact, 4)
                        times.append(time.perf_counter() - start)
                    assert old_context(store, probes[0], 4) == new_context(store, probes[0], 4)
                    print(f"{n:>7} facts  {name}: {1e3 * statistics.median(times):8.2f} ms "
                          f"median per fact ({len(times)} trials)")
    from inferscale_memory.embeddings import default_embedder

    embedder = default_embedder()
    embedder.embed(["warm up"])
    times = []
    for i in range(20):
        start = time.perf_counter()
        embedder.embed([f"Fact number {i} about the user's day."])
        times.append(time.perf_counter() - start)
    print(f"MiniLM, one fact's text embedded (old way only): "
          f"{1e3 * statistics.median(times):.2f} ms median")


if __name__ == "__main__":
    main()

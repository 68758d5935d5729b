"""The writer process of the kill -9 test (tests/test_durability.py).

Run as ``python durability_writer.py STORE_PATH SEED GENERATION``: it opens the store
and writes random adds (single and batched), updates, deletes and delete-alls until it is
killed. Around every call it prints one JSON line to stdout, flushed:

- ``{"begin": op}`` just before the call (the call may or may not commit),
- ``{"ack": result}`` only after the call returned (the write must be durable).

The embedder is a deterministic stand-in (a unit vector seeded by the text's hash): the
test is about SQLite and the store's transactions, and loading MiniLM would make each of
the many restarts take seconds.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

import numpy as np

USERS = ("dur-a", "dur-b", "dur-c")
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


class HashEmbedder:
    """A unit vector per text, from a generator seeded by the text's SHA-256."""

    dim = 64
    name = "hash-embedder"

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
            vec = np.random.default_rng(seed).standard_normal(self.dim)
            rows.append(vec / np.linalg.norm(vec))
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


def _text(rng: random.Random, tag: str) -> str:
    # Unique prefix; sometimes long, so that one transaction spans several pages.
    words = rng.choices(WORDS, k=rng.choice((3, 8, 40, 400)))
    return f"{tag} " + " ".join(words)


def _next_op(rng: random.Random, live: dict[str, dict[str, str]], tag: str) -> dict:
    user = rng.choice(USERS)
    owned = sorted(live[user])
    roll = rng.random()
    if roll < 0.45 or not owned:
        n = rng.choice((1, 1, 1, 3, 12))
        texts = [_text(rng, f"{tag}.{i}") for i in range(n)]
        return {"kind": "add", "user": user, "texts": texts,
                "metadata": [{"tag": tag, "i": i, "w": rng.random()} for i in range(n)]}
    if roll < 0.75:
        meta = None if rng.random() < 0.5 else {"tag": tag, "updated": True}
        return {"kind": "update", "user": user, "id": rng.choice(owned),
                "text": _text(rng, tag), "metadata": meta}
    if roll < 0.97:
        return {"kind": "delete", "user": user, "id": rng.choice(owned)}
    return {"kind": "delete_all", "user": user}


def _apply(store, op: dict, live: dict[str, dict[str, str]]) -> object:
    user = op["user"]
    if op["kind"] == "add":
        texts = op["texts"]
        arg = texts[0] if len(texts) == 1 else texts
        meta = op["metadata"][0] if len(texts) == 1 else op["metadata"]
        added = store.add(arg, user_id=user, metadata=meta)
        facts = [added] if len(texts) == 1 else added
        live[user].update({f.id: f.text for f in facts})
        return [f.id for f in facts]
    if op["kind"] == "update":
        store.update(op["id"], op["text"], user_id=user, metadata=op["metadata"])
        live[user][op["id"]] = op["text"]
        return op["id"]
    if op["kind"] == "delete":
        store.delete(op["id"], user_id=user)
        del live[user][op["id"]]
        return op["id"]
    count = store.delete_all(user_id=user)
    live[user].clear()
    return count


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    from inferscale_memory.store import MemoryStore

    path, seed, generation = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(f"{seed}-{generation}")
    store = MemoryStore(path, HashEmbedder())
    live = {u: {f.id: f.text for f in store.list(user_id=u)} if store.has_user(u) else {}
            for u in USERS}
    _say({"ready": generation})
    for n in range(1_000_000):
        op = _next_op(rng, live, f"g{generation}n{n}")
        _say({"begin": op})
        _say({"ack": _apply(store, op, live)})


if __name__ == "__main__":
    main()

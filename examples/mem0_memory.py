"""Mem0 on inferscale-memory: Mem0 stores the facts, the engine keeps their KV.

``mem0_inferscale.from_engine`` returns a plain ``mem0.Memory`` configured fully offline
(extraction and embeddings on the engine, qdrant in local mode); every fact it stores is
captured on the engine, and ``answer`` injects Mem0's search results as KV.

Run: ``python examples/mem0_memory.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile

from facts import CAROLINE

import mem0_inferscale
from inferscale_memory import ChatResult, MemoryEngine


def run(engine: MemoryEngine, folder: str, user: str = "caroline") -> list[ChatResult]:
    """Add, update and delete through Mem0; answer by KV and by text."""
    memory = mem0_inferscale.from_engine(engine, folder=folder)
    added = memory.add([{"role": "user", "content": fact} for fact in CAROLINE],
                       user_id=user, infer=False)
    job_id = next(m["id"] for m in added["results"] if "nurse" in m["memory"])
    memory.update(job_id, text="Caroline works as a surgeon.")
    replies = [mem0_inferscale.answer(memory, "What is Caroline's job?", user_id=user, k=10,
                                      mode=mode, max_tokens=32) for mode in ("kv", "text")]
    for reply in replies:  # same token ids; a cold text prefill may round apart
        m = reply.metrics
        print(f"[{m.mode}] injected {m.injected_tokens} tokens, computed {m.computed_tokens}, "
              f"TTFT {m.ttft_ms:.0f} ms: {reply.text!r}")
    memory.delete(job_id)
    # Mem0 lists 20 memories unless told how many
    left = memory.get_all(filters={"user_id": user}, top_k=len(CAROLINE))
    print("left:", len(left["results"]), "memories")
    print("history:", [e["event"] for e in memory.history(job_id)])
    return replies


def main() -> None:
    # Stores of its own (the engine's and Mem0's): the example never touches your data.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        run(engine, folder)


if __name__ == "__main__":
    main()

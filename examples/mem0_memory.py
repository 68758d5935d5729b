"""Mem0 on inferscale-memory: Mem0 stores the facts, the engine keeps their KV.

``mem0_inferscale.from_engine`` returns a plain ``mem0.Memory`` configured fully offline
(extraction and embeddings on the engine, qdrant in local mode); every fact it stores is
captured on the engine, and ``answer`` injects Mem0's search results as KV.

Run: ``python examples/mem0_memory.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile

import mem0_inferscale
from inferscale_memory import MemoryEngine

USER = "caroline"


def main() -> None:
    """Add, update and delete through Mem0; answer by KV and by text."""
    # Stores of its own (the engine's and Mem0's): the example never touches your data.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        memory = mem0_inferscale.from_engine(engine, folder=folder)
        added = memory.add([{"role": "user", "content": "Caroline moved to Berlin in 2023."},
                            {"role": "user", "content": "Caroline works as a nurse."}],
                           user_id=USER, infer=False)
        job_id = added["results"][1]["id"]
        memory.update(job_id, text="Caroline works as a surgeon.")
        for mode in ("kv", "text"):  # same token ids; a cold text prefill may round apart
            reply = mem0_inferscale.answer(memory, "What is Caroline's job?", user_id=USER,
                                           k=2, mode=mode, max_tokens=32)
            print(f"[{mode}] {reply.text!r}: TTFT {reply.metrics.ttft_ms:.0f} ms, "
                  f"injected {reply.metrics.injected_tokens} tokens")
        memory.delete(job_id)
        print("left:", [m["memory"] for m in memory.get_all(filters={"user_id": USER})["results"]])
        print("history:", [e["event"] for e in memory.history(job_id)])


if __name__ == "__main__":
    main()

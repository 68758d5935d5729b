"""``inferscale-memory demo``: a few users' facts, questions, KV path beside text path."""

from __future__ import annotations

import tempfile
from pathlib import Path

from inferscale_memory.engine import MemoryEngine

FACTS = {
    "caroline": [
        "Caroline moved to Berlin in May 2023.",
        "Caroline works as a nurse at a children's hospital.",
        "Caroline has a golden retriever called Biscuit.",
        "Caroline is learning to play the cello.",
        "Caroline's favourite food is ramen.",
    ],
    "melanie": [
        "Melanie lives in Lisbon with her two kids.",
        "Melanie paints landscapes on weekends.",
        "Melanie is allergic to peanuts.",
        "Melanie ran her first marathon in October 2022.",
    ],
    "omar": [
        "Omar is a software engineer who writes compilers.",
        "Omar grows tomatoes on his balcony.",
        "Omar's sister is called Leila.",
        "Omar drinks his coffee black.",
    ],
}

QUESTIONS = [
    ("caroline", "Where does Caroline live?"),
    ("caroline", "What is the name of Caroline's dog?"),
    ("melanie", "What is Melanie allergic to?"),
    ("omar", "What does Omar grow on his balcony?"),
]


def run_demo(model: str | None = None, k: int = 4) -> None:
    """Start the engine, add the facts, answer each question on both paths."""
    with tempfile.TemporaryDirectory() as tmp:
        store_path = str(Path(tmp) / "demo.sqlite")
        with MemoryEngine(model, store_path=store_path) as engine:
            for user_id, facts in FACTS.items():
                engine.memory.add(facts, user_id=user_id)
            print(f"model: {engine.model_path.name}; facts added for {len(FACTS)} users\n")
            for user_id, question in QUESTIONS:
                messages = [{"role": "user", "content": question}]
                text = engine.chat(messages, user_id=user_id, k=k, mode="text", max_tokens=32)
                kv = engine.chat(messages, user_id=user_id, k=k, mode="kv", max_tokens=32)
                print(f"[{user_id}] {question}")
                print(f"  kv   ({kv.metrics.ttft_ms:7.1f} ms TTFT, "
                      f"{kv.metrics.injected_tokens} tokens injected): {kv.text.strip()}")
                print(f"  text ({text.metrics.ttft_ms:7.1f} ms TTFT, "
                      f"{text.metrics.computed_tokens} tokens computed): {text.text.strip()}\n")

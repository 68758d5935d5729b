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
        "Caroline's brother Tom lives in Dublin.",
        "Caroline goes swimming every Tuesday morning.",
        "Caroline is reading a novel about the sea.",
        "Caroline drives an old green bicycle to work.",
        "Caroline visited Japan in spring 2022.",
    ],
    "melanie": [
        "Melanie lives in Lisbon with her two kids.",
        "Melanie paints landscapes on weekends.",
        "Melanie is allergic to peanuts.",
        "Melanie ran her first marathon in October 2022.",
        "Melanie teaches maths at a secondary school.",
        "Melanie's daughter is called Sofia.",
        "Melanie plays the guitar in a small band.",
        "Melanie grows herbs in her kitchen window.",
        "Melanie has never been to Asia.",
        "Melanie prefers tea to coffee.",
    ],
    "omar": [
        "Omar is a software engineer who writes compilers.",
        "Omar grows tomatoes on his balcony.",
        "Omar's sister is called Leila.",
        "Omar drinks his coffee black.",
        "Omar plays chess online every evening.",
        "Omar lives in Toronto.",
        "Omar is training for a half marathon.",
        "Omar collects vinyl records of jazz.",
        "Omar speaks Arabic, English and French.",
        "Omar adopted a grey cat named Pixel.",
    ],
}

QUESTIONS = [
    ("caroline", "Where does Caroline live?"),
    ("caroline", "What is the name of Caroline's dog?"),
    ("melanie", "What is Melanie allergic to?"),
    ("omar", "What does Omar grow on his balcony?"),
]


def run_demo(model: str | None = None, k: int = 8) -> None:
    """Start the engine, add the facts, answer each question on both paths.

    Both paths get the same ``k`` retrieved facts. The KV path follows the default
    answer-quality policy: the facts' KV is injected, except the last
    ``recompute_tail`` facts (those nearest the question), which vLLM computes.
    """
    with tempfile.TemporaryDirectory() as tmp:
        store_path = str(Path(tmp) / "demo.sqlite")
        with MemoryEngine(model, store_path=store_path) as engine:
            for user_id, facts in FACTS.items():
                engine.memory.add(facts, user_id=user_id)
            tail = engine.config.recompute_tail
            print(f"model: {engine.model_path.name}; {len(FACTS)} users with "
                  f"{len(FACTS['caroline'])} facts each; {k} retrieved per question")
            print(f"kv:   the facts' KV computed once when added and injected; the last "
                  f"{tail} (nearest the question) computed\ntext: every fact computed from "
                  "its text, as memory frameworks prompt today\n")
            for user_id, question in QUESTIONS:
                messages = [{"role": "user", "content": question}]
                text = engine.chat(messages, user_id=user_id, k=k, mode="text", max_tokens=32)
                kv = engine.chat(messages, user_id=user_id, k=k, mode="kv", max_tokens=32)
                facts = len(kv.metrics.fact_ids)
                injected = len(kv.metrics.injected_fact_ids)
                print(f"[{user_id}] {question}")
                print(f"  kv   ({kv.metrics.ttft_ms:7.1f} ms TTFT, {injected} facts injected, "
                      f"{facts - injected} computed): {kv.text.strip()}")
                print(f"  text ({text.metrics.ttft_ms:7.1f} ms TTFT, "
                      f"{len(text.metrics.fact_ids)} facts computed): {text.text.strip()}\n")

"""A tiny LoCoMo-format dataset (the real data is CC BY-NC and never used by tests) and an
engine double for the benchmark code that needs no vLLM."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from inferscale_memory.config import MemoryConfig
from inferscale_memory.results import ChatMetrics, ChatResult
from inferscale_memory.store import Fact, ScoredFact

LOCOMO = [
    {
        "sample_id": "conv-a",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I moved to Berlin last week!"},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Nice. I adopted a dog.",
                 "blip_caption": "a photo of a puppy"},
            ],
            "session_2_date_time": "10:00 am on 12 June, 2023",
            "session_2": [
                {"speaker": "Ana", "dia_id": "D2:1", "text": "I started cello lessons."},
                {"speaker": "Ben", "dia_id": "D2:2", "text": "My dog is called Rex."},
            ],
            "session_3_date_time": "9:00 am on 1 July, 2023",
        },
        "observation": {
            "session_1_observation": {
                "Ana": [["Ana moved to Berlin.", "D1:1"]],
                "Ben": [["Ben adopted a dog.", ["D1:2"]]],
            },
            "session_2_observation": {
                "Ana": [["Ana takes cello lessons.", "D2:1"]],
                "Ben": [["Ben's dog is called Rex.", "D2:2, D1:2"]],
            },
        },
        "qa": [
            {"question": "Where does Ana live?", "answer": "Berlin", "evidence": ["D1:1"],
             "category": 4},
            {"question": "What is Ben's dog called?", "answer": "Rex",
             "evidence": ["D2:2", "D:1:2"], "category": 4},
            {"question": "Is Ana a pilot?", "adversarial_answer": "yes", "evidence": [],
             "category": 5},
            {"question": "When did Ana move?", "answer": 2023, "evidence": ["D1:1"],
             "category": 2},
            {"question": "What are Ana's hobbies?", "answer": "cello, Berlin walks",
             "evidence": ["D2:1"], "category": 1},
        ],
    },
    {
        "sample_id": "conv-b",
        "conversation": {"session_1_date_time": "8:00 pm on 3 March, 2022",
                         "session_1": [{"speaker": "Cy", "dia_id": "D1:1",
                                        "text": "I love tea."}]},
        "observation": {"session_1_observation": {"Cy": [["Cy loves tea.", "D1:1"]]}},
        "qa": [{"question": "What does Cy love?", "answer": "tea; green tea",
                "evidence": ["D1:1"], "category": 3}],
    },
]


class FakeMemory:
    def __init__(self) -> None:
        self.facts: dict[str, list[Fact]] = {}
        self._ids = itertools.count()

    def add(self, texts: list[str], *, user_id: str,
            metadata: list[dict[str, Any]] | None = None) -> list[Fact]:
        metadata = metadata or [{} for _ in texts]
        added = [Fact(f"f{next(self._ids)}", user_id, text, meta, 0.0, 0.0)
                 for text, meta in zip(texts, metadata, strict=True)]
        self.facts.setdefault(user_id, []).extend(added)
        return added

    def search(self, query: str, *, user_id: str, k: int) -> list[ScoredFact]:
        """The newest ``k`` facts, newest (best) first: a top-k is a prefix of a top-(k+1),
        as with the real index."""
        return [ScoredFact(f, 1.0) for f in self.facts[user_id][::-1][:k]]

    def delete_all(self, *, user_id: str) -> int:
        return len(self.facts.pop(user_id, []))


class FakeEngine:
    """Answers with the best-ranked retrieved fact; records every call."""

    def __init__(self) -> None:
        self.ignore_eos: list[bool] = []
        self.memory = FakeMemory()
        self.config = MemoryConfig(max_fact_tokens=256, dtype="bfloat16")
        self.builder = type("Builder", (), {"fact_ids": staticmethod(str.split)})()
        self.model_path = Path("fake-model")
        self.model_name = self.model_path.name
        self.max_model_len = 2048
        self.runtime = type("Runtime", (), {"max_model_len": 2048, "start_s": 12.34,
                                            "engine_settings": {"max_cudagraph_size": 512}})()
        self.calls: list[tuple[str, int, str]] = []
        self.resets = 0

    def answer(self, messages: list[dict[str, str]], facts: list[Fact | ScoredFact], *,
               user_id: str, mode: str, max_tokens: int) -> ChatResult:
        facts = [f if isinstance(f, ScoredFact) else ScoredFact(f, 0.0) for f in facts]
        self.calls.append((messages[-1]["content"], len(facts), mode))
        text = facts[0].fact.text if facts else "I do not know"
        metrics = ChatMetrics(mode=mode, ttft_ms=10.0 if mode == "kv" else 30.0,
                              latency_ms=50.0, retrieval_ms=0.0, prompt_tokens=40,
                              memory_tokens=8 * len(facts), injected_tokens=0,
                              cached_tokens=0, computed_tokens=40, output_tokens=3)
        return ChatResult(text, metrics, facts, [], [1, 2, 3] if mode == "kv" else [1, 2, 4])

    async def achat(self, messages: list[dict[str, str]], *, user_id: str, mode: str,
                    facts: list[Fact], max_tokens: int, ignore_eos: bool = False) -> ChatResult:
        self.ignore_eos.append(ignore_eos)
        await asyncio.sleep(0)
        return self.answer(messages, facts, user_id=user_id, mode=mode, max_tokens=max_tokens)

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def arun(self, coro: Any) -> Any:
        return asyncio.run(coro)

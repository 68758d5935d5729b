"""``bench ttft``: time to first token of the text path vs the KV path, over k.

Synthetic random facts; every trial uses a different fact set, so the prefix cache cannot
help the text path; the same token ids are sent on both paths.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from inferscale_memory.engine import MemoryEngine
from inferscale_memory.store import Fact

WORDS = (
    "river garden violin morning teacher orange mountain library bicycle winter painter "
    "harbor coffee festival lantern meadow kitchen thunder notebook island dancer marble "
    "forest ticket silver cousin museum pepper journey blanket"
).split()
QUESTION = "Summarise what you know about me in one sentence."
USER = "bench-user"


@dataclass
class TtftRow:
    k: int
    memory_tokens: float
    text_median_ms: float
    text_p90_ms: float
    kv_median_ms: float
    kv_p90_ms: float

    @property
    def ratio(self) -> float:
        return self.kv_median_ms / self.text_median_ms if self.text_median_ms else float("nan")


def random_fact(rng: random.Random, words: int) -> str:
    return "The user " + " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def run_ttft(model: str | None = None, ks: tuple[int, ...] = (0, 10, 20, 40), trials: int = 5,
             fact_words: int = 16, seed: int = 0, out: Path | None = None) -> list[TtftRow]:
    """Measure TTFT per path and k; returns one row per k (and writes JSON to ``out``)."""
    rng = random.Random(seed)
    num_facts = max(ks) * (trials + 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, MemoryEngine(
            model, store_path=str(Path(tmp) / "bench.sqlite")) as engine:
        facts = engine.memory.add([random_fact(rng, fact_words) for _ in range(num_facts)],
                                  user_id=USER)
        messages = [{"role": "user", "content": QUESTION}]
        _one(engine, messages, facts[:max(ks)], "kv")  # warm-up of both paths
        _one(engine, messages, facts[:max(ks)], "text")
        for k in ks:
            times: dict[str, list[float]] = {"kv": [], "text": []}
            tokens = []
            for _ in tqdm(range(trials), desc=f"k={k}", leave=False):
                chosen = rng.sample(facts, k)
                for mode in ("kv", "text"):
                    metrics = _one(engine, messages, chosen, mode).metrics
                    times[mode].append(metrics.ttft_ms)
                    tokens.append(metrics.memory_tokens)
            rows.append(TtftRow(k, statistics.mean(tokens), *_stats(times["text"]),
                                *_stats(times["kv"])))
    if out is not None:
        out.write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=2))
    return rows


def _one(engine: MemoryEngine, messages: list[dict[str, str]], facts: list[Fact], mode: str):
    return engine.answer(messages, facts, user_id=USER, mode=mode, max_tokens=1)


def _stats(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return statistics.median(ordered), p90


def format_table(rows: list[TtftRow]) -> str:
    lines = ["| k | memory tokens | text TTFT median (p90) ms | KV TTFT median (p90) ms "
             "| KV / text |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.k} | {r.memory_tokens:.0f} | {r.text_median_ms:.1f} "
                     f"({r.text_p90_ms:.1f}) | {r.kv_median_ms:.1f} ({r.kv_p90_ms:.1f}) | "
                     f"{r.ratio:.2f} |")
    return "\n".join(lines)

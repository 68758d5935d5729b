"""``bench ttft``: time to first token of the text path vs the KV path, over k.

Synthetic random facts; every trial uses a different fact set, so the prefix cache cannot
help the text path; the same token ids are sent on both paths. k = 0 (no facts) is the
floor: the cost of the question alone. Measured in a shuffled order after warm-up rounds
(see :func:`run_ttft`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tqdm import tqdm

from inferscale_memory.bench.run_folder import RunFolder
from inferscale_memory.bench.stats import median, percentile
from inferscale_memory.bench.synthetic import LoadLog
from inferscale_memory.engine import MemoryEngine
from inferscale_memory.fields import MODES
from inferscale_memory.results import ChatResult
from inferscale_memory.store import Fact

WORDS = (
    "river garden violin morning teacher orange mountain library bicycle winter painter "
    "harbor coffee festival lantern meadow kitchen thunder notebook island dancer marble "
    "forest ticket silver cousin museum pepper journey blanket"
).split()
QUESTION = "Summarise what you know about me in one sentence."


@dataclass
class TtftRow:
    k: int
    memory_tokens: float
    text_median_ms: float
    text_p90_ms: float
    kv_median_ms: float
    kv_p90_ms: float
    load_median_ms: float | None = None  # the connector's load step (--connector-timing)

    @property
    def ratio(self) -> float:
        return self.kv_median_ms / self.text_median_ms if self.text_median_ms else float("nan")


def random_fact(rng: random.Random, words: int) -> str:
    return "The user " + " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def add_random_facts(engine: MemoryEngine, user_id: str, count: int, words: int,
                     rng: random.Random) -> list[Fact]:
    """Store (and capture) ``count`` random facts of ``words`` words for ``user_id``."""
    return engine.memory.add([random_fact(rng, words) for _ in range(count)], user_id=user_id)


def run_ttft(engine: MemoryEngine, ks: Sequence[int] = (0, 10, 20, 40), trials: int = 5,
             fact_words: int = 16, seed: int = 0, run: RunFolder | None = None,
             progress: bool = True, warmup: int = 5,
             loads: LoadLog | None = None) -> list[TtftRow]:
    """Measure TTFT per path and k; one row per k (records and summary go to ``run``).

    The (k, trial) pairs run in a shuffled order, each pair's paths in a random order, so
    a drift of the machine (a neighbour's load, the engine settling after the capture of
    many facts) spreads over every k and path instead of biasing the first ones measured.
    ``warmup`` rounds (both paths at every k) run before. With ``loads`` (the engine was
    started with the connector's load log on), each KV record gets the time of its load
    step (``load_ms``).
    """
    rng = random.Random(seed)
    engine.reset_prefix_cache()  # an earlier run with this seed left these very prompts
    user_id = f"bench-ttft-{uuid.uuid4().hex[:8]}"
    facts = add_random_facts(engine, user_id, max(1, max(ks) * (trials + 1)), fact_words,
                             rng)
    plan = [(k, trial) for k in ks for trial in range(trials)]
    rng.shuffle(plan)
    records = []
    try:
        for _ in range(warmup):
            for k in ks:
                for mode in MODES:
                    _one(engine, user_id, rng.sample(facts, k), mode)
        if loads is not None:
            loads.take()
        for k, trial in tqdm(plan, desc="ttft", disable=not progress):
            chosen = rng.sample(facts, k)
            for mode in rng.sample(MODES, len(MODES)):
                m = _one(engine, user_id, chosen, mode).metrics
                records.append({"k": k, "trial": trial, "mode": mode, "ttft_ms": m.ttft_ms,
                                "memory_tokens": m.memory_tokens,
                                "computed_tokens": m.computed_tokens,
                                "injected_tokens": m.injected_tokens})
                if loads is not None:
                    steps = loads.take()
                    if mode == "kv":
                        records[-1]["load_ms"] = sum(step["ms"] for step in steps)
                if run is not None:
                    run.append(records[-1])
    finally:
        engine.memory.delete_all(user_id=user_id)
    rows = ttft_rows(records)
    if run is not None:
        run.write_summary(summarize_ttft(rows, fact_words=fact_words, trials=trials))
    return rows


def _one(engine: MemoryEngine, user_id: str, facts: list[Fact], mode: str) -> ChatResult:
    messages = [{"role": "user", "content": QUESTION}]
    return engine.answer(messages, facts, user_id=user_id, mode=mode, max_tokens=1)


def ttft_rows(records: list[dict[str, Any]]) -> list[TtftRow]:
    """Median and p90 TTFT per k and path from per-request records."""
    rows = []
    for k in sorted({r["k"] for r in records}):
        times = {mode: [r["ttft_ms"] for r in records if r["k"] == k and r["mode"] == mode]
                 for mode in ("text", "kv")}
        tokens = [r["memory_tokens"] for r in records if r["k"] == k]
        load = [r["load_ms"] for r in records if r["k"] == k and "load_ms" in r]
        rows.append(TtftRow(k, sum(tokens) / len(tokens), median(times["text"]),
                            percentile(times["text"], 90), median(times["kv"]),
                            percentile(times["kv"], 90), median(load) if load else None))
    return rows


def summarize_ttft(rows: list[TtftRow], **params: Any) -> dict[str, Any]:
    return {"workload": "ttft", **params,
            "ttft": [asdict(r) | {"ratio": r.ratio} for r in rows]}

"""``bench throughput``: requests/s, output tokens/s and TTFT under concurrent load.

Random facts as in ``bench ttft``. For each concurrency N and path: a one-shot batch (N
requests at once through ``asyncio.gather`` on the engine loop) and a closed loop (N
clients, each sending its next request when the last one finished, for a count of
requests or a duration). Both paths draw the same fact sets (k random facts per request).

Every answer is exactly ``output_len`` tokens (``ignore_eos``), so both paths decode the
same amount and output tokens/s compares like with like.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from inferscale_memory.bench.run_folder import RunFolder
from inferscale_memory.bench.stats import median, percentile
from inferscale_memory.bench.ttft import add_random_facts
from inferscale_memory.engine import MemoryEngine
from inferscale_memory.fields import MODES
from inferscale_memory.results import ChatResult
from inferscale_memory.store import Fact

PATTERNS = ("batch", "closed")
QUESTION = "Tell me a long story about my life, using everything you know about me."


class _Load:
    """The fact sets of one (concurrency, pattern), the same sequence for each path."""

    def __init__(self, engine: MemoryEngine, user_id: str, facts: list[Fact], k: int,
                 output_len: int, seed: str) -> None:
        self.engine, self.user_id, self.facts = engine, user_id, facts
        self.k, self.output_len, self.seed = k, output_len, seed

    async def batch(self, concurrency: int, mode: str) -> list[ChatResult]:
        rng = random.Random(self.seed)
        return list(await asyncio.gather(*(self._one(rng, mode) for _ in range(concurrency))))

    async def closed(self, concurrency: int, mode: str, requests: int,
                     duration: float | None) -> list[ChatResult]:
        rng = random.Random(self.seed)
        deadline = time.perf_counter() + duration if duration else None
        remaining = [requests]
        results: list[ChatResult] = []

        async def client() -> None:
            while (time.perf_counter() < deadline) if deadline else remaining[0] > 0:
                remaining[0] -= 1
                results.append(await self._one(rng, mode))

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return results

    async def _one(self, rng: random.Random, mode: str) -> ChatResult:
        chosen = rng.sample(self.facts, self.k)
        return await self.engine.achat([{"role": "user", "content": QUESTION}],
                                       user_id=self.user_id, mode=mode, facts=chosen,
                                       max_tokens=self.output_len, ignore_eos=True)


def run_throughput(engine: MemoryEngine, concurrencies: Sequence[int], run: RunFolder, *,
                   k: int = 10, output_len: int = 32, loop_requests: int = 3,
                   duration: float | None = None, fact_words: int = 16, seed: int = 0,
                   progress: bool = True) -> dict[str, Any]:
    """Measure every (concurrency, pattern, path); returns (and writes) the summary.

    The closed loop sends ``loop_requests`` requests per client, or runs for ``duration``
    seconds when that is given.
    """
    engine.reset_prefix_cache()  # an earlier run with this seed left these very prompts
    user_id = f"bench-throughput-{uuid.uuid4().hex[:8]}"
    facts = add_random_facts(engine, user_id, max(100, k * max(concurrencies)), fact_words,
                             random.Random(seed))
    try:
        warm = _Load(engine, user_id, facts, k, output_len, f"{seed}:warm-up")
        for mode in MODES:  # the engine settles after the capture, and batches get warm
            engine.arun(warm.batch(max(concurrencies), mode))
        groups = [(n, p, m) for n in concurrencies for p in PATTERNS for m in MODES]
        for n, pattern, mode in tqdm(groups, desc="throughput", disable=not progress):
            load = _Load(engine, user_id, facts, k, output_len, f"{seed}:{n}:{pattern}")
            start = time.perf_counter()
            if pattern == "batch":
                results = engine.arun(load.batch(n, mode))
            else:
                results = engine.arun(load.closed(n, mode, n * loop_requests, duration))
            seconds = time.perf_counter() - start
            for result in results:
                run.append(_row(result, n, pattern, mode, k, output_len, seconds))
    finally:
        engine.memory.delete_all(user_id=user_id)
    summary = summarize_throughput(run.rows())
    run.write_summary(summary)
    return summary


def _row(result: ChatResult, concurrency: int, pattern: str, mode: str, k: int,
         output_len: int, seconds: float) -> dict[str, Any]:
    m = result.metrics
    return {"concurrency": concurrency, "pattern": pattern, "mode": mode, "k": k,
            "output_len": output_len,
            "group_seconds": seconds, "ttft_ms": m.ttft_ms, "latency_ms": m.latency_ms,
            "prompt_tokens": m.prompt_tokens, "injected_tokens": m.injected_tokens,
            "computed_tokens": m.computed_tokens, "output_tokens": m.output_tokens}


def summarize_throughput(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (concurrency, pattern, path): requests/s, output tokens/s, TTFT p50/p99."""
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["concurrency"], row["pattern"], row["mode"]), []).append(row)
    entries = []
    for (n, pattern, mode), group in sorted(groups.items()):
        seconds = group[0]["group_seconds"]
        ttft = [r["ttft_ms"] for r in group]
        entries.append({
            "concurrency": n, "pattern": pattern, "mode": mode, "requests": len(group),
            "seconds": seconds, "requests_per_s": len(group) / seconds,
            "output_tokens_per_s": sum(r["output_tokens"] for r in group) / seconds,
            "ttft_p50_ms": median(ttft), "ttft_p99_ms": percentile(ttft, 99),
            "latency_p50_ms": median(r["latency_ms"] for r in group)})
    first = rows[0] if rows else {}
    return {"workload": "throughput", "k": first.get("k"),
            "output_len": first.get("output_len"), "throughput": entries}

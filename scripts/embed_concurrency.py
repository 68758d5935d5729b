"""What concurrent chats pay to embed their questions (``MiniLMEmbedder``'s coalescing).

A micro-benchmark run by hand, never a test: N threads at once each embed one LoCoMo-like
question, as N chats with memory do on the event loop's executor, with the default
embedder (all-MiniLM-L6-v2 on the CPU). ``coalesced`` is the embedder as it is: the calls
waiting at once go through one forward. ``one by one`` is the way of before 2026-12-05:
a lock, one forward per call (the same forward, ``MiniLMEmbedder._forward``). Printed per
N: the time until every call has its rows, and the median and slowest call.

Run: ``.venv/bin/python scripts/embed_concurrency.py [--callers 1,8,64] [--trials 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from inferscale_memory.embeddings import MiniLMEmbedder, default_embedder


def one_by_one(embedder: MiniLMEmbedder):
    lock = threading.Lock()

    def embed(texts: list[str]):
        with lock:
            return embedder._forward(texts)
    return embed


def trial(embed, questions: list[str]) -> tuple[float, list[float]]:
    """All of ``questions`` embedded at once, one call each: the wall time and each call's."""
    start = threading.Barrier(len(questions) + 1)

    def ask(question: str) -> float:
        start.wait()
        began = time.perf_counter()
        embed([question])
        return time.perf_counter() - began

    with ThreadPoolExecutor(max_workers=len(questions)) as pool:
        futures = [pool.submit(ask, q) for q in questions]
        start.wait()
        began = time.perf_counter()
        calls = [f.result() for f in futures]
        return time.perf_counter() - began, calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--callers", default="1,8,64")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    embedder = default_embedder()
    ways = {"one by one": one_by_one(embedder), "coalesced": embedder.embed}
    print("| callers | way | all done, ms (median) | call median, ms | slowest call, ms |")
    print("|---|---|---|---|---|")
    for callers in (int(n) for n in args.callers.split(",")):
        questions = [f"What did Caroline say about her trip to city {i} last summer?"
                     for i in range(callers)]
        runs: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in ways}
        for number in range(args.trials + 1):  # the ways take turns; the first is a warm-up
            for name, embed in ways.items():
                result = trial(embed, questions)
                if number:
                    runs[name].append(result)
        for name, results in runs.items():
            calls = [c for _, cs in results for c in cs]
            wall = statistics.median(w for w, _ in results)
            print(f"| {callers} | {name} | {1e3 * wall:.1f} | "
                  f"{1e3 * statistics.median(calls):.1f} | {1e3 * max(calls):.1f} |")

if __name__ == "__main__":
    main()

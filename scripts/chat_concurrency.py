"""What 64 chats at once wait for before their prompt reaches vLLM: retrieval.

A benchmark run by hand, never a test: an engine on the tests' tiny random-weight model
(``tests/tool_model.py``, ``enforce_eager``: it starts in seconds and prefills a short
prompt in milliseconds, so the host's work shows), the default embedder and store, 300
facts of one user, then N chats at once with memory, one answer token each, as many
trials as asked. Printed: the time until every chat is answered, and the median and
slowest ``retrieval_ms`` (embedding the question and searching the user's facts) and
``ttft_ms`` of the chats. Run it at two commits to compare them.

Run: ``.venv/bin/python scripts/chat_concurrency.py [--chats 64] [--trials 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def burst(engine, chats: int) -> tuple[float, list[float], list[float]]:
    questions = [[{"role": "user", "content": f"What did Caroline say about topic {i}?"}]
                 for i in range(chats)]
    began = time.perf_counter()
    results = await asyncio.gather(*(engine.achat(q, user_id="u", max_tokens=1)
                                     for q in questions))
    return ((time.perf_counter() - began) * 1e3, [r.metrics.retrieval_ms for r in results],
            [r.metrics.ttft_ms for r in results])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chats", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("tool_model", ROOT / "tests" / "tool_model.py")
    assert spec is not None and spec.loader is not None
    tool_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool_model)
    from inferscale_memory import MemoryEngine

    with tempfile.TemporaryDirectory() as folder:
        model = tool_model.write_tool_model(Path(folder) / "tiny")
        with MemoryEngine(str(model), store_path=str(Path(folder) / "memory.sqlite"),
                          kv_cache_gb=1, max_model_len=2048, enforce_eager=True) as engine:
            engine.memory.add([f"Caroline fact {i} about topic {i % 13}" for i in range(300)],
                              user_id="u")
            engine.arun(burst(engine, args.chats))  # warm
            runs = [engine.arun(burst(engine, args.chats)) for _ in range(args.trials)]
    retrieval = [ms for _, got, _ in runs for ms in got]
    ttft = [ms for _, _, got in runs for ms in got]
    print(f"{args.chats} chats at once: all answered in "
          f"{statistics.median(wall for wall, _, _ in runs):.0f} ms (median of {args.trials}); "
          f"retrieval median {statistics.median(retrieval):.0f} ms, slowest "
          f"{max(retrieval):.0f}; TTFT median {statistics.median(ttft):.0f} ms")


if __name__ == "__main__":
    main()

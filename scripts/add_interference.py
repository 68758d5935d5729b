"""A chat's time to first token while another user's big ``add`` is being captured.

A micro-benchmark run by hand, never a test. One engine (the embedded default model,
default policy); user ``bob`` holds a few facts. Per trial, another user adds ``--facts``
facts in one call (a thread), and once their captures are under way bob asks a question:
its TTFT with the engine's capture gate (the default) and without it (every capture sent
at once, as before 2026-12-05), arms alternated.

Run: ``.venv/bin/python scripts/add_interference.py [--facts 200] [--trials 2]``.
"""

from __future__ import annotations

import argparse
import threading
import time

from inferscale_memory import MemoryEngine
from inferscale_memory.capture_gate import CaptureGate


def trial(engine: MemoryEngine, user: str, facts: int, wait_s: float) -> tuple[float, float]:
    texts = [f"{user} noted item {i}: a blue box on shelf {i % 13}." for i in range(facts)]
    start = time.perf_counter()
    adder = threading.Thread(target=engine.memory.add, args=(texts,),
                             kwargs={"user_id": user})
    adder.start()
    time.sleep(wait_s)  # the add has embedded its facts and sent its captures
    reply = engine.chat([{"role": "user", "content": "Where does Bob live?"}],
                        user_id="bob", k=5, max_tokens=1)
    adder.join()
    return reply.metrics.ttft_ms, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--facts", type=int, default=200)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--wait", type=float, default=3.0)
    args = parser.parse_args()
    with MemoryEngine(store_path=":memory:") as engine:
        engine.memory.add(["Bob lives in Lisbon.", "Bob works as a nurse.",
                           "Bob has a cat named Tom."], user_id="bob")
        gated = engine.fact_kv.gate
        print(f"engine: {engine.runtime.engine_settings}; gate budget "
              f"{gated.budget_tokens} tokens")
        for i in range(args.trials):
            for name, gate in (("no gate", CaptureGate(None)), ("gate", gated)):
                engine.fact_kv.gate = gate
                ttft, add_s = trial(engine, f"user{i}{name[0]}", args.facts, args.wait)
                print(f"trial {i} {name:>8}: bob's TTFT {ttft:9.0f} ms; "
                      f"the add of {args.facts} facts {add_s:6.1f} s")


if __name__ == "__main__":
    main()

"""Start an engine twice with the same settings and print how long each start took.

The first start of a model and settings compiles the model (and fills vLLM's compile
cache, ``~/.cache/vllm``); the second loads it from there. Run with
``INFERSCALE_VLLM_LOGS=1 VLLM_LOGGING_LEVEL=INFO`` to see vLLM's own lines ("Directly load
AOT compilation from ..." on a cache hit).

    python scripts/start_time.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from inferscale_memory import MemoryEngine


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for i in range(2):
            began = time.perf_counter()
            with MemoryEngine(store_path=str(Path(folder) / f"start{i}.sqlite"),
                              kv_cache_gb=1, max_model_len=1536, recompute_tail=0,
                              capture_context=0) as engine:
                print(f"start {i}: {time.perf_counter() - began:.1f} s "
                      f"(vLLM runtime {engine.runtime.start_s:.1f} s)", flush=True)
                reply = engine.chat([{"role": "user", "content": "Say hi."}], max_tokens=4)
                print(f"answer: {reply.text!r}", flush=True)


if __name__ == "__main__":
    main()

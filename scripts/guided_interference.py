"""How much one guided request within the schema limits slows another user's plain chat.

A measurement run by hand, never a test (tests/test_engine_tools.py checks the ordering
that this relies on: a plain chat finishes while a guided request is still compiling).
It starts one engine, measures a plain chat alone (the baseline), then the same plain
chat sent while a guided request with an abusive-but-within-``schema_limits`` schema is in
flight, and prints each plain chat's latency, the medians and their ratio:

- ``patterns``: 100 string properties, each with its own pattern ``^[a-z]{1,n}$`` (7 KB;
  the compiler's cache serves a repeated subschema, so they differ). vLLM's front end
  turns it into a grammar quickly; the engine core then compiles the token masks for
  seconds, on its grammar thread pool (off the scheduling loop).
- ``repeats``: 60 string properties with the pattern ``^[a-z]{1,900}$`` (4 KB). The
  runtime turns it into a grammar for seconds (``xgr.Grammar.from_json_schema``, on a
  thread: ``inferscale_memory/driver/guided_json.py``; vLLM's front end did it until
  2026-12-03, on its input-processing thread pool of ``renderer_num_workers`` threads),
  then the engine core compiles it for seconds more.

Run: ``.venv/bin/python scripts/guided_interference.py [--plain 8] [--engine-args JSON]``,
e.g. ``--engine-args '{"renderer_num_workers": 2}'``. Numbers from a shared 2-core machine
are rough; compare the two columns of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from inferscale_memory import MemoryEngine, SchemaError
from inferscale_memory.schema_limits import SchemaLimits, check_guided

PLAIN = [{"role": "user", "content": "Name three colours of the rainbow."}]
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def schemas() -> dict[str, dict[str, Any]]:
    """The abusive schemas, with names of their own (no compile cache of an earlier
    request serves them)."""
    tag = uuid.uuid4().hex[:6]
    names = [f"f{i:03d}{tag}" for i in range(100)]
    patterns = {"type": "object", "required": names, "properties": {
        name: {"type": "string", "pattern": f"^[a-z]{{1,{20 + i}}}$"}
        for i, name in enumerate(names)}}
    names = names[:60]
    repeats = {"type": "object", "required": names, "properties": dict.fromkeys(
        names, {"type": "string", "pattern": "^[a-z]{1,900}$"})}
    return {"patterns": patterns, "repeats": repeats}


def plain_chat(engine: MemoryEngine) -> float:
    """One plain chat without a user (a salt of its own: a full prefill); its seconds."""
    start = time.perf_counter()
    engine.chat(PLAIN, max_tokens=16, ignore_eos=True)
    return time.perf_counter() - start


def alongside(engine: MemoryEngine, pool: ThreadPoolExecutor, schema: dict[str, Any],
              count: int) -> tuple[list[float], int, float]:
    """Plain chats sent one after another while a guided request is in flight (at most
    ``count``): their seconds, how many finished before the guided one, and the guided
    one's seconds."""
    fmt = {"type": "json_schema", "json_schema": {"name": "abusive", "schema": schema}}
    start = time.perf_counter()
    guided: Future[Any] = pool.submit(engine.chat, ASK, max_tokens=16, response_format=fmt)
    time.sleep(0.05)  # the guided request reaches vLLM first
    seconds, before = [], 0
    while not guided.done() and len(seconds) < count:
        seconds.append(plain_chat(engine))
        before += not guided.done()
    try:
        guided.result()
    except SchemaError as exc:  # vLLM ended it as an error; the plain chats still count
        print(f"  the guided request failed: {exc}")
    return seconds, before, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plain", type=int, default=8, help="plain chats per measurement")
    parser.add_argument("--engine-args", default="{}", help="extra vLLM engine arguments")
    args = parser.parse_args()
    for name, schema in schemas().items():
        check_guided(SchemaLimits(), schema)  # within the default limits
        print(f"{name}: {len(json.dumps(schema, separators=(',', ':')))} bytes, within limits")
    with MemoryEngine(engine_args=json.loads(args.engine_args)) as engine, \
            ThreadPoolExecutor(1) as pool:
        for _ in range(3):
            plain_chat(engine)  # warm-up
        base = [plain_chat(engine) for _ in range(args.plain)]
        print(f"baseline plain chat: median {statistics.median(base) * 1000:.0f} ms "
              f"({', '.join(f'{s * 1000:.0f}' for s in base)})")
        for name, schema in schemas().items():
            seconds, before, guided_s = alongside(engine, pool, schema, args.plain)
            ratio = statistics.median(seconds) / statistics.median(base)
            print(f"alongside {name}: median {statistics.median(seconds) * 1000:.0f} ms, "
                  f"{ratio:.2f}x baseline, max {max(seconds) * 1000:.0f} ms; {before} of "
                  f"{len(seconds)} finished before the guided request ({guided_s:.1f} s); "
                  f"each: {', '.join(f'{s * 1000:.0f}' for s in seconds)}")


if __name__ == "__main__":
    main()

"""What a host-tier hit costs: TTFT of facts copied back from host memory, against facts
already on the device and against the text path (what an evicted fact costs).

A GPU-sized shape with dummy weights (``bench synthetic``'s), a device pool for
``--device-facts`` facts and a large host tier. ``--facts`` facts are captured; most of
them end up on the host. Per trial, k random facts are answered three ways: KV (the facts
on the host are promoted first: the report says how many), KV again with the same facts
in another order (now all on the device: no promotion, no prefix-cache hit beyond the
header), and text. vLLM's prefix cache is reset before each first run.

    python scripts/host_tier_bench.py --shape llama-3.1-8b --k 10 50 --trials 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any


def run(args: argparse.Namespace) -> dict[str, Any]:
    from inferscale_memory.bench.synthetic import (
        SHAPES,
        SyntheticWorkload,
        dummy_runtime,
        write_dummy_model,
    )

    shape = SHAPES[args.shape]
    heads, layers = shape["num_key_value_heads"], shape["num_hidden_layers"]
    head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
    token_bytes = layers * 2 * heads * head_dim * 2  # bf16
    fact_len = header_len = 32
    device_tokens = header_len + args.device_facts * fact_len
    workdir = Path(tempfile.mkdtemp(prefix="host-tier-"))
    runtime = dummy_runtime(write_dummy_model(workdir / args.shape, args.shape),
                            kv_pool_gb=device_tokens * token_bytes / 2**30,
                            kv_host_pool_gb=args.host_gb)
    try:
        work = SyntheticWorkload(runtime, int(shape["vocab_size"]), header_len=header_len,
                                 fact_len=fact_len)

        async def measure() -> dict[str, Any]:
            for _ in range(0, args.facts, 16):  # batches: in-flight captures count too
                await work.capture(16)
            for mode in ("kv", "text"):  # warm-up
                await work.run(work.prompt(work.sample(max(args.k))), mode)
            rows = []
            for k in args.k:
                times: dict[str, list[float]] = {"host": [], "device": [], "text": []}
                promoted = []
                for _ in range(args.trials):
                    facts = work.sample(k)
                    # Else a fact first in the prompt may come from vLLM's prefix cache
                    # (its capture's blocks), not be loaded, and so stay on the host.
                    await runtime.reset_prefix_cache()
                    first = await work.run(work.prompt(facts), "kv")
                    promoted.append(len(first.report.get("promoted", [])))
                    times["host"].append(first.ttft_s * 1000)
                    work.shuffle(facts)
                    again = await work.run(work.prompt(facts), "kv")
                    if again.report.get("promoted") or again.report["missing"]:
                        raise RuntimeError(f"facts left the device: {again.report}")
                    times["device"].append(again.ttft_s * 1000)
                    work.shuffle(facts)
                    times["text"].append((await work.run(work.prompt(facts), "text")).ttft_s
                                         * 1000)
                rows.append({"k": k, "promoted_median": statistics.median(promoted),
                             **{f"{m}_median_ms": statistics.median(v)
                                for m, v in times.items()}})
            return {"shape": args.shape, "facts": args.facts,
                    "device_facts": args.device_facts, "token_bytes": token_bytes,
                    "rows": rows}

        return runtime.run(measure())
    finally:
        runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--facts", type=int, default=400)
    parser.add_argument("--device-facts", type=int, default=64)
    parser.add_argument("--host-gb", type=float, default=8.0)
    parser.add_argument("--k", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", default="host-tier.json")
    args = parser.parse_args()
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("| k | facts promoted (median) | KV, from host ms | KV, on device ms | text ms |")
    print("|---|---|---|---|---|")
    for r in report["rows"]:
        print(f"| {r['k']} | {r['promoted_median']:.0f} | {r['host_median_ms']:.1f} | "
              f"{r['device_median_ms']:.1f} | {r['text_median_ms']:.1f} |")


if __name__ == "__main__":
    main()

"""Our floor against vLLM's, interleaved: both engines up at once on one device.

`bench synthetic` measures vLLM's floor (the same arguments, no connector) after our
engine has closed, minutes later; hosts move the floor by several ms in that time, so its
ratio can mislead (2026-12-03: 0.93x in one run, 1.61x and 1.82x in two others of the
same hold). This script starts both engines side by side (each with its share of the
device: ``--gpu-memory-utilization``) and alternates their requests, trial by trial, in
turn order ABBA, so that drift falls on both: header + question alone, as
:func:`inferscale_memory.bench.synthetic.measure_floor` sends them, on our text path, our
KV path (no facts) and vLLM without the connector. Since the KV path sends a request that
injects no fact as the text request (as the engine does), the two "ours" arms are the same
request: their ratio shows the spread of the measurement.

A measurement run by hand on a GPU, never a test:
``python3 scripts/floor_ab.py --shape llama-3.1-8b --trials 60 --workdir WORK``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from inferscale_memory.bench.synthetic import (
    SHAPES,
    SyntheticWorkload,
    dummy_runtime,
    write_dummy_model,
)

ARMS = ("ours_text", "ours_kv", "vllm")


def ttft_ms(work: SyntheticWorkload, mode: str) -> float:
    """One header + question request's time to first token."""
    completion = work.runtime.run(work.run(work.prompt([]), mode))
    return completion.ttft_s * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--plain-first", action="store_true",
                        help="start vLLM without the connector first (the start order can matter)")
    parser.add_argument("--out", type=Path, help="the medians and every trial as JSON")
    args = parser.parse_args()
    folder = write_dummy_model(args.workdir / args.shape, args.shape)
    vocab = int(SHAPES[args.shape]["vocab_size"])
    share = {"gpu_memory_utilization": args.gpu_memory_utilization, "kv_pool_gb": 1.0}
    if args.plain_first:
        plain = dummy_runtime(folder, connector=False, **share)
        ours = dummy_runtime(folder, **share)
    else:
        ours = dummy_runtime(folder, **share)
        plain = dummy_runtime(folder, connector=False, **share)
    try:
        works = {"ours": SyntheticWorkload(ours, vocab), "vllm": SyntheticWorkload(plain, vocab)}
        turns = [("ours", "text", "ours_text"), ("ours", "kv", "ours_kv"),
                 ("vllm", "text", "vllm")]
        for name, mode, _ in turns * 3:  # warm-up
            ttft_ms(works[name], mode)
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for trial in range(args.trials):
            for name, mode, arm in (turns if trial % 2 == 0 else turns[::-1]):
                times[arm].append(ttft_ms(works[name], mode))
    finally:
        ours.close()
        plain.close()
    medians = {arm: statistics.median(values) for arm, values in times.items()}
    paired = [a / b for a, b in zip(times["ours_text"], times["vllm"], strict=True)]
    for arm in ARMS:
        print(f"{arm}: median {medians[arm]:.2f} ms over {args.trials} trials")
    print(f"ours (text) / vLLM: {medians['ours_text'] / medians['vllm']:.3f}x of the medians, "
          f"median of the paired ratios {statistics.median(paired):.3f}x")
    print(f"ours (KV) / ours (text): {medians['ours_kv'] / medians['ours_text']:.3f}x")
    if args.out is not None:
        args.out.write_text(json.dumps({"shape": args.shape, "plain_first": args.plain_first,
                                        "medians_ms": medians,
                                        "paired_ratio_median": statistics.median(paired),
                                        "trials_ms": times}, indent=1))


if __name__ == "__main__":
    main()

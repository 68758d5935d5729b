"""Where a KV request's time goes beyond the floor: arms interleaved in one engine, and
the engine's Python sampled while it serves them.

`bench synthetic` measures each k in its own block of trials, so a tail's cost or the
load step's is the difference of two medians taken minutes apart. Here one engine (dummy
weights, ``bench synthetic``'s workload: 32-token header and facts, 16-token question)
serves every arm in turn, trial by trial, in turn order ABBA: the text path at k = 0 (the
floor), the KV path at k = 0, and per k the KV path with every fact injected (tail 0),
with the default tail (4) and the text path. Then ``py-spy`` (``--py-spy``) samples the
engine's processes (front end, engine core, its worker) while they serve a block of one
arm, once per arm named by ``--profile``, as collapsed stacks: the share of samples in
the connector's code against vLLM's own says what our host path costs.

A measurement run by hand on a GPU, never a test:
``python3 scripts/profile_kv.py --shape llama-3.1-8b --k 50,100 --trials 40 --workdir W
--out W/profile --py-spy /path/to/py-spy``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from inferscale_memory.bench.synthetic import (
    SHAPES,
    SyntheticWorkload,
    dummy_runtime,
    write_dummy_model,
)

TAIL = 4


def arms(ks: list[int]) -> list[tuple[str, int, str, int]]:
    """(name, k, mode, recompute tail) of every arm."""
    out = [("text k=0", 0, "text", 0), ("kv k=0", 0, "kv", 0)]
    for k in ks:
        out += [(f"kv k={k} tail 0", k, "kv", 0), (f"kv k={k} tail {TAIL}", k, "kv", TAIL),
                (f"text k={k}", k, "text", 0)]
    return out


def ttft_ms(work: SyntheticWorkload, k: int, mode: str, tail: int) -> float:
    work.recompute_tail = tail
    prompt = work.prompt(work.sample(k))
    return work.runtime.run(work.run(prompt, mode)).ttft_s * 1000


def sample(py_spy: str, out: Path, seconds: float, serve: object) -> None:
    """``serve()`` while py-spy records this process and its children into ``out``."""
    spy = subprocess.Popen([py_spy, "record", "--pid", str(os.getpid()), "--subprocesses",
                            "--rate", "1000", "--format", "raw", "--nonblocking",
                            "--duration", str(int(seconds) + 5), "--output", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2.0)  # py-spy attaches to every process first
    try:
        serve()
    finally:
        try:
            spy.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--k", default="50,100")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="a folder for the results")
    parser.add_argument("--py-spy", help="py-spy's path: sample the engine's Python")
    parser.add_argument("--profile", default="text k=0,kv k=50 tail 4",
                        help="the arms py-spy samples, comma-separated")
    parser.add_argument("--profile-requests", type=int, default=150)
    parser.add_argument("--engine-args", type=json.loads, default={})
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    folder = write_dummy_model(args.workdir / args.shape, args.shape)
    runtime = dummy_runtime(folder, engine_args=args.engine_args)
    try:
        work = SyntheticWorkload(runtime, int(SHAPES[args.shape]["vocab_size"]))
        runtime.run(work.capture(max(200, 4 * max(ks))))
        plan = arms(ks)
        for _, k, mode, tail in plan * 3:  # warm-up
            ttft_ms(work, k, mode, tail)
        times: dict[str, list[float]] = {name: [] for name, *_ in plan}
        for trial in range(args.trials):
            for name, k, mode, tail in (plan if trial % 2 == 0 else plan[::-1]):
                times[name].append(ttft_ms(work, k, mode, tail))
        medians = {name: statistics.median(values) for name, values in times.items()}
        floor = medians["text k=0"]
        for name, value in medians.items():
            print(f"{name:>18}: median {value:6.2f} ms  ({value / floor:.3f}x the floor)")
        (args.out / "arms.json").write_text(json.dumps(
            {"shape": args.shape, "trials": args.trials, "engine_args": args.engine_args,
             "medians_ms": medians, "trials_ms": times}, indent=1))
        if args.py_spy:
            by_name = {name: (k, mode, tail) for name, k, mode, tail in plan}
            for name in [n.strip() for n in args.profile.split(",") if n.strip()]:
                k, mode, tail = by_name[name]
                seconds = args.profile_requests * medians[name] / 1000

                def serve(k: int = k, mode: str = mode, tail: int = tail) -> None:
                    for _ in range(args.profile_requests):
                        ttft_ms(work, k, mode, tail)

                slug = name.replace(" ", "_").replace("=", "")
                sample(args.py_spy, args.out / f"spy-{slug}.txt", seconds, serve)
                print(f"sampled {name}: {args.profile_requests} requests")
    finally:
        runtime.close()


if __name__ == "__main__":
    main()

"""``inferscale-memory bench ...``: the benchmark subcommands and their arguments.

Heavy imports (vLLM, torch) happen only when a subcommand runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_memory.config import QUALITY_FIELDS
from inferscale_memory.fields import CONTEXT_ORDERS, FACT_ORDERS

if TYPE_CHECKING:
    from inferscale_memory.bench.run_folder import RunFolder
    from inferscale_memory.engine import MemoryEngine



def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


KV_CACHE_DTYPES = ("auto", "fp8")  # vLLM's kv_cache_dtype values the benchmarks offer


def _kv_cache_dtypes(text: str) -> list[str]:
    names = _names(text)
    unknown = [name for name in names if name not in KV_CACHE_DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated values of {', '.join(KV_CACHE_DTYPES)}, got {text!r}")
    return names


def _shapes(text: str) -> list[str]:
    from inferscale_memory.bench.shapes import SHAPES

    names = _names(text)
    unknown = [name for name in names if name not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown shape(s) {', '.join(unknown) or text!r}; known: {', '.join(SHAPES)}")
    return names


def add_bench_parser(commands: Any) -> None:
    """Add ``bench`` and its workloads to the top-level subparsers."""
    bench = commands.add_parser("bench", help="benchmarks (each writes a run folder)")
    workloads = bench.add_subparsers(dest="workload", required=True)
    out_help = "run folder (default runs/<workload>-<time>)"

    locomo = workloads.add_parser("locomo", help="LoCoMo answer quality and latency, KV vs text")
    locomo.add_argument("--dataset", type=Path, required=True,
                        help="LoCoMo-format JSON (e.g. locomo10.json; CC BY-NC, not shipped)")
    locomo.add_argument("--k", type=_ints, default=[5, 10, 20, 50],
                        help="comma-separated k values (0 = no memory)")
    locomo.add_argument("--limit", type=int, default=None, help="questions per conversation")
    locomo.add_argument("--conversations", type=_names, default=None,
                        help="comma-separated indices or sample ids (default: all)")
    locomo.add_argument("--seed", type=int, default=0, help="seed of the question subset")
    locomo.add_argument("--memory", choices=("observations", "turns"), default="observations",
                        help="memory unit: per-session observations or dialogue turns")
    locomo.add_argument("--max-tokens", type=int, default=32, help="answer length cap")
    locomo.add_argument("--resume", action="store_true",
                        help="continue the run in --out, skipping requests already recorded")
    locomo.add_argument("--fact-order", choices=FACT_ORDERS, default=None,
                        help="facts in the prompt: best-ranked last, or oldest first "
                             "(default: the config's fact_order)")
    locomo.add_argument("--recompute-tail", type=int, default=None, metavar="R",
                        help="compute the last R facts from text on the KV path "
                             "(default: the config's recompute_tail)")
    locomo.add_argument("--capture-context", type=int, default=None, metavar="N",
                        help="capture each fact after its N most similar facts "
                             "(default: the config's capture_context)")
    locomo.add_argument("--capture-context-order", choices=CONTEXT_ORDERS, default=None,
                        help="those facts oldest first, or least similar first "
                             "(default: the config's capture_context_order)")
    locomo.add_argument("--concurrency", type=int, default=16,
                        help="requests in flight at once (1: every question alone)")
    locomo.add_argument("--sequential", type=int, default=3, metavar="Q",
                        help="questions per conversation answered one request at a time "
                             "first: the TTFT of the report is theirs (with --concurrency > 1)")
    locomo.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                        help="vLLM's KV cache dtype, on both paths (default: the config's "
                             "engine_args, else auto: the model's dtype)")
    locomo.add_argument("--text-from", type=Path, default=None, metavar="RUN_DIR",
                        help="reuse the text-path records of a run with the same questions, "
                             "facts and prompt order (the text path does not depend on "
                             "recompute_tail or capture_context)")

    ttft = workloads.add_parser("ttft", help="TTFT of text vs KV over k, random facts")
    ttft.add_argument("--k", type=_ints, default=[0, 10, 20, 40])
    ttft.add_argument("--trials", type=int, default=5)
    ttft.add_argument("--fact-words", type=int, default=16)
    ttft.add_argument("--seed", type=int, default=0)
    ttft.add_argument("--connector-timing", action="store_true",
                      help="log the connector's load step of each KV request (on a GPU it "
                           "synchronises the device after each, costing some TTFT)")
    ttft.add_argument("--warmup", type=int, default=5,
                      help="rounds of both paths at every k before measuring")

    throughput = workloads.add_parser("throughput", help="requests/s and TTFT under load")
    throughput.add_argument("--concurrency", type=_ints, default=[1, 4, 8, 16])
    throughput.add_argument("--k", type=int, default=10)
    throughput.add_argument("--output-len", type=int, default=32,
                            help="answer length cap (tokens)")
    throughput.add_argument("--loop-requests", type=int, default=3,
                            help="closed loop: requests per client")
    throughput.add_argument("--duration", type=float, default=None,
                            help="closed loop: run for this many seconds instead")
    throughput.add_argument("--fact-words", type=int, default=16)
    throughput.add_argument("--seed", type=int, default=0)

    for parser in (locomo, ttft, throughput):
        parser.add_argument("--model", default=None, help="Hugging Face model folder")
        parser.add_argument("--out", type=Path, default=None, help=out_help)
        parser.add_argument("--no-progress", action="store_true", help="no progress bars")

    compare = workloads.add_parser("compare", help="differences between two runs' summaries")
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument("--only", default="", metavar="TEXT",
                         help="keep the keys that contain TEXT (e.g. requests_per_s)")
    report = workloads.add_parser("report", help="rewrite a run folder's report and plots")
    report.add_argument("run", type=Path)
    _add_synthetic(workloads)
    _add_index(workloads)


def _add_index(workloads: Any) -> None:
    index = workloads.add_parser("index", help="search latency of the exact vs Qdrant index")
    index.add_argument("--facts", type=int, nargs="+", default=[10000, 100000],
                       help="collection sizes (random unit vectors)")
    index.add_argument("--backends", default="exact,qdrant-memory,qdrant-path",
                       help="comma-separated: exact, qdrant-memory, qdrant-path, sqlite, "
                            "postgres, postgres-hnsw (the last three: the stores' adds)")
    index.add_argument("--dim", type=int, default=384, help="vector size (the embedder's)")
    index.add_argument("--users", type=int, default=1, help="users the facts are spread over")
    index.add_argument("--queries", type=int, default=50)
    index.add_argument("--k", type=int, default=10)
    index.add_argument("--seed", type=int, default=0)
    index.add_argument("--out", type=Path, default=None, help="write the rows as JSON")


def _index(args: argparse.Namespace) -> int:
    from inferscale_memory.bench import index as index_bench

    rows = index_bench.run_index_bench(
        args.facts, args.backends.split(","), dim=args.dim, users=args.users,
        queries=args.queries, k=args.k, seed=args.seed, out=args.out)
    print(index_bench.format_table(rows))
    return 0


def _add_synthetic(workloads: Any) -> None:
    synthetic = workloads.add_parser(
        "synthetic", help="token-level TTFT/throughput on a model shape with dummy weights")
    synthetic.add_argument("--shape", type=_shapes, default=["llama-3.1-8b"],
                           help="model shape(s), comma-separated (several: one report each, "
                                "--out holds them all and a table is printed)")
    synthetic.add_argument("--kv-cache-dtype", type=_kv_cache_dtypes, default=None,
                           metavar="{auto,fp8}[,...]",
                           help="vLLM's KV cache dtype(s), comma-separated: each shape runs "
                                "with each (default: --engine-args' kv_cache_dtype, else auto)")
    synthetic.add_argument("--kv-pool-gb", type=float, default=None,
                           help="the fact pool's budget per GPU (default: room for every fact "
                                "the run captures)")
    synthetic.add_argument("--k", default="0,10,20,50,100")
    synthetic.add_argument("--trials", type=int, default=10)
    synthetic.add_argument("--concurrency", type=int, default=64)
    synthetic.add_argument("--output-len", type=int, default=32)
    synthetic.add_argument("--workdir", type=Path, default=Path("runs"))
    synthetic.add_argument("--gpu-memory-utilization", type=float, default=0.7,
                           help="vLLM's share of GPU memory (the fact KV pool lives outside)")
    synthetic.add_argument("--out", type=Path, default=None,
                           help="write the report as JSON (rewritten after every point)")
    synthetic.add_argument("--tensor-parallel-size", type=int, default=1)
    synthetic.add_argument("--recompute-tail", type=int, default=None, metavar="R",
                           help="facts computed at the end on the KV path (default: config)")
    synthetic.add_argument("--capture-context", type=int, default=None, metavar="N",
                           help="also time captures after N held facts, as the library "
                                "captures (default: config's capture_context; 0: skip)")
    synthetic.add_argument("--connector-timing", action="store_true",
                           help="log the connector's load steps and report their median time")
    synthetic.add_argument("--engine-args", type=json.loads, default={}, metavar="JSON",
                           help="extra vLLM engine arguments, e.g. "
                                "'{\"max_num_seqs\": 128}' (over the library's settings)")
    synthetic.add_argument("--no-vllm-floor", dest="vllm_floor", action="store_false",
                           help="skip the like-for-like floor (vLLM again, no connector)")


@contextlib.contextmanager
def _engine(model: str | None, **overrides: Any) -> Iterator[MemoryEngine]:
    """An engine with a throw-away fact store (benchmarks never touch the user's store)."""
    from inferscale_memory.engine import MemoryEngine

    with tempfile.TemporaryDirectory() as tmp, MemoryEngine(
            model, store_path=str(Path(tmp) / "bench.sqlite"), **overrides) as engine:
        yield engine


def run_bench(args: argparse.Namespace) -> int:
    """Run the ``bench`` subcommand that ``args`` names."""
    if args.workload == "compare":
        from inferscale_memory.bench.compare import format_differences
        from inferscale_memory.bench.run_folder import load_summary

        print(format_differences(load_summary(args.run_a), load_summary(args.run_b),
                                 args.only))
        return 0
    if args.workload == "report":
        from inferscale_memory.bench.report import write_report
        from inferscale_memory.bench.run_folder import RunFolder

        for path in write_report(RunFolder(args.run)):
            print(path)
        return 0
    if args.workload == "synthetic":
        return _synthetic(args)
    if args.workload == "index":
        return _index(args)
    from inferscale_memory.bench import commands

    loads = None
    if args.workload == "ttft" and args.connector_timing:
        from inferscale_memory.bench.synthetic import LoadLog
        from inferscale_memory.connector.worker import TIMING_ENV

        loads = LoadLog(Path(tempfile.mkdtemp()) / "connector-timing.jsonl")
        os.environ[TIMING_ENV] = str(loads.path)  # the engine's processes inherit it
    quality = {name: getattr(args, name, None)
               for name in QUALITY_FIELDS}
    with _engine(args.model, **quality, **_kv_cache_override(args)) as engine:
        print(f"engine: {engine.model_name} started in {engine.runtime.start_s:.1f} s",
              flush=True)
        progress = not args.no_progress
        if args.workload == "locomo":
            run = commands.bench_locomo(
                engine, args.dataset, args.k, limit=args.limit, conversations=args.conversations,
                seed=args.seed, memory=args.memory, max_tokens=args.max_tokens, out=args.out,
                resume=args.resume, text_from=args.text_from, progress=progress,
                concurrency=args.concurrency, sequential=args.sequential)
        elif args.workload == "ttft":
            run = commands.bench_ttft(engine, args.k, trials=args.trials,
                                      fact_words=args.fact_words, seed=args.seed,
                                      warmup=args.warmup, out=args.out, progress=progress,
                                      loads=loads)
        else:
            run = commands.bench_throughput(
                engine, args.concurrency, k=args.k, output_len=args.output_len,
                loop_requests=args.loop_requests, duration=args.duration,
                fact_words=args.fact_words, seed=args.seed, out=args.out, progress=progress)
    _print_run(run)
    return 0


def _kv_cache_override(args: argparse.Namespace) -> dict[str, Any]:
    """``engine_args`` with ``--kv-cache-dtype`` over the config's (env, file) own."""
    dtype = getattr(args, "kv_cache_dtype", None)
    if dtype is None:
        return {}
    from inferscale_memory.config import MemoryConfig

    return {"engine_args": {**MemoryConfig.load().engine_args, "kv_cache_dtype": dtype}}


def _print_run(run: RunFolder) -> None:
    from inferscale_memory.bench.report import TABLES

    summary = run.summary()
    print(TABLES[summary["workload"]](summary))
    print(f"\nrun folder: {run.path} (report.md, summary.json, requests.jsonl, plots)")


def _synthetic(args: argparse.Namespace) -> int:
    from inferscale_memory.bench.sweep import format_sweep, run_sweep
    from inferscale_memory.bench.synthetic import format_report, run_synthetic

    ks = [int(k) for k in args.k.split(",")]
    options: dict[str, Any] = dict(
        ks=ks, trials=args.trials, concurrency=args.concurrency, output_len=args.output_len,
        workdir=args.workdir, connector_timing=args.connector_timing,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size, recompute_tail=args.recompute_tail,
        capture_context=args.capture_context, vllm_floor=args.vllm_floor,
        engine_args=args.engine_args)
    if args.kv_pool_gb is not None:
        options["kv_pool_gb"] = args.kv_pool_gb
    dtypes = args.kv_cache_dtype or [args.engine_args.get("kv_cache_dtype") or "auto"]
    if len(args.shape) * len(dtypes) == 1:
        print(format_report(run_synthetic(args.shape[0], kv_cache_dtype=dtypes[0],
                                          out=args.out, **options)))
        return 0
    runs = run_sweep(args.shape, dtypes, args.out, run_synthetic, **options)
    for report in runs:
        if "error" not in report:
            print(format_report(report), end="\n\n")
    print(format_sweep(runs, ks))
    return 0 if all("error" not in report for report in runs) else 1

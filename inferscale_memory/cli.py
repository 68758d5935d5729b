"""The ``inferscale-memory`` command: prepare, demo, bench, serve, migrate-index."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import InferScaleError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferscale-memory",
                                     description="Fact-KV memory for LLM apps on vLLM.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="convert the embedded default model once")
    prepare.add_argument("--cache-dir", type=Path, default=None)
    demo = commands.add_parser("demo", help="facts about a few users, KV vs text answers")
    demo.add_argument("--model", default=None, help="Hugging Face model folder")
    bench = commands.add_parser("bench", help="benchmarks")
    workloads = bench.add_subparsers(dest="workload", required=True)
    ttft = workloads.add_parser("ttft", help="TTFT of text vs KV over k, random facts")
    ttft.add_argument("--model", default=None)
    ttft.add_argument("--k", default="0,10,20,40", help="comma-separated k values")
    ttft.add_argument("--trials", type=int, default=5)
    ttft.add_argument("--fact-words", type=int, default=16)
    ttft.add_argument("--seed", type=int, default=0)
    ttft.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    serve = commands.add_parser("serve", help="OpenAI-compatible chat server with memory")
    serve.add_argument("--model", default=None, help="Hugging Face model folder")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (127.0.0.1 whenever no API keys are set)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-keys", type=Path, default=None, metavar="FILE",
                       help="JSON {key: [tenants] or \"*\"} (default: $INFERSCALE_API_KEYS)")
    index = workloads.add_parser("index", help="search latency of the exact vs Qdrant index")
    index.add_argument("--facts", type=int, nargs="+", default=[10000, 100000],
                       help="collection sizes (random unit vectors)")
    index.add_argument("--backends", default="exact,qdrant-memory,qdrant-path",
                       help="comma-separated: exact, qdrant-memory, qdrant-path")
    index.add_argument("--dim", type=int, default=384, help="vector size (the embedder's)")
    index.add_argument("--users", type=int, default=1, help="tenants the facts are spread over")
    index.add_argument("--queries", type=int, default=50)
    index.add_argument("--k", type=int, default=10)
    index.add_argument("--seed", type=int, default=0)
    index.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    migrate = commands.add_parser(
        "migrate-index", help="copy a fact store's vectors into a Qdrant collection (idempotent)")
    migrate.add_argument("--to", choices=["qdrant"], required=True, help="the index backend")
    migrate.add_argument("--config", type=Path, default=None,
                         help="JSON config file (INFERSCALE_* env and these flags override it)")
    migrate.add_argument("--store", default=None, help="SQLite fact store (default: store_path)")
    target = migrate.add_mutually_exclusive_group()
    target.add_argument("--qdrant-path", default=None,
                        help="embedded Qdrant folder (default: <store>.qdrant)")
    target.add_argument("--qdrant-url", default=None, help="Qdrant server, e.g. http://host:6333")
    migrate.add_argument("--qdrant-api-key", default=None,
                         help="server API key (better: $INFERSCALE_QDRANT_API_KEY)")
    migrate.add_argument("--collection", default=None,
                         help="Qdrant collection (default: inferscale_facts)")
    synthetic = workloads.add_parser(
        "synthetic", help="token-level TTFT/throughput on a model shape with dummy weights")
    synthetic.add_argument("--shape", default="llama-3.1-8b")
    synthetic.add_argument("--k", default="0,10,20,50,100")
    synthetic.add_argument("--trials", type=int, default=10)
    synthetic.add_argument("--concurrency", type=int, default=64)
    synthetic.add_argument("--output-len", type=int, default=32)
    synthetic.add_argument("--workdir", type=Path, default=Path("runs"))
    synthetic.add_argument("--gpu-memory-utilization", type=float, default=0.7,
                           help="vLLM's share of GPU memory (the fact KV pool lives outside)")
    synthetic.add_argument("--out", type=Path, default=None, help="write the report as JSON")
    args = parser.parse_args(argv)
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return _run(args)
    except InferScaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "prepare":
        from inferscale_memory.models import prepare_default_model

        cache_dir = args.cache_dir or MemoryConfig.load().cache_dir
        print(prepare_default_model(cache_dir))
    elif args.command == "demo":
        from inferscale_memory.demo import run_demo

        run_demo(args.model)
    elif args.command == "serve":
        from inferscale_memory.server import serve

        serve(args.model, args.host, args.port, args.api_keys)
    elif args.command == "migrate-index":
        from inferscale_memory.store.migrate import migrate_to_qdrant

        config = MemoryConfig.load(
            args.config, index=args.to, store_path=args.store, qdrant_path=args.qdrant_path,
            qdrant_url=args.qdrant_url, qdrant_api_key=args.qdrant_api_key,
            qdrant_collection=args.collection)
        print(migrate_to_qdrant(config))
    elif args.workload == "index":
        from inferscale_memory.bench import index as index_bench

        index_rows = index_bench.run_index_bench(
            args.facts, args.backends.split(","), dim=args.dim, users=args.users,
            queries=args.queries, k=args.k, seed=args.seed, out=args.out)
        print(index_bench.format_table(index_rows))
    elif args.workload == "ttft":
        from inferscale_memory.bench.ttft import format_table, run_ttft

        ks = tuple(int(k) for k in args.k.split(","))
        rows = run_ttft(args.model, ks, args.trials, args.fact_words, args.seed, args.out)
        print(format_table(rows))
    elif args.workload == "synthetic":
        import json

        from inferscale_memory.bench.synthetic import format_report, run_synthetic

        report = run_synthetic(args.shape, [int(k) for k in args.k.split(",")], args.trials,
                               args.concurrency, args.output_len, args.workdir,
                               gpu_memory_utilization=args.gpu_memory_utilization)
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=2))
        print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``inferscale-memory`` command: prepare, demo, bench, serve, migrate-index."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from inferscale_memory.bench.cli import add_bench_parser, run_bench
from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import InferScaleError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferscale-memory",
                                     description="Fact-KV memory for LLM apps on vLLM.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show vLLM's own output and every library's INFO logs")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser(
        "prepare", help="install the embedder's weights, fetch and convert the default model")
    prepare.add_argument("--cache-dir", type=Path, default=None)
    demo = commands.add_parser("demo", help="facts about a few users, KV vs text answers")
    demo.add_argument("--model", default=None, help="Hugging Face model folder")
    add_bench_parser(commands)
    serve = commands.add_parser("serve", help="OpenAI-compatible chat server with memory")
    serve.add_argument("--model", default=None, help="Hugging Face model folder")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (127.0.0.1 whenever no API keys are set)")
    serve.add_argument("--port", type=int, default=8000,
                       help="port to bind (0: one the system picks, named in the serving line)")
    serve.add_argument("--api-keys", type=Path, default=None, metavar="FILE",
                       help="JSON {key: [users] or \"*\"} (default: $INFERSCALE_API_KEYS)")
    serve.add_argument("--max-tokens-limit", type=int, default=None, metavar="N",
                       help="largest max_tokens a chat may ask for (default 4096); 0: only "
                            "the model's context")
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
    copy = commands.add_parser(
        "migrate-store", help="copy a SQLite fact store into PostgreSQL (idempotent)")
    copy.add_argument("--to", choices=["postgres"], required=True, help="the store backend")
    copy.add_argument("--config", type=Path, default=None,
                      help="JSON config file (INFERSCALE_* env and these flags override it)")
    copy.add_argument("--store", default=None, help="SQLite fact store (default: store_path)")
    copy.add_argument("--postgres-url", default=None,
                      help="target database (better: $INFERSCALE_POSTGRES_URL, it may hold "
                           "a password)")
    args = parser.parse_args(argv)
    if args.verbose:
        os.environ.setdefault("INFERSCALE_VLLM_LOGS", "1")  # vLLM's own output, as it prints it
    else:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # The project's progress (INFO) and everyone's warnings and errors; vLLM's output goes
    # to its log file unless --verbose (inferscale_memory.vllm_log).
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("inferscale_memory").setLevel(logging.INFO)
    try:
        return _run(args)
    except InferScaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "prepare":
        from inferscale_memory.prepare import prepare_all

        cache_dir = args.cache_dir or MemoryConfig.load().cache_dir
        prepare_all(cache_dir, report=lambda line: print(line, flush=True))
        print("ready: inferscale-memory demo")
    elif args.command == "demo":
        from inferscale_memory.demo import run_demo

        run_demo(args.model)
    elif args.command == "serve":
        from inferscale_memory.server import serve

        limit = {} if args.max_tokens_limit is None else {
            "max_tokens_limit": args.max_tokens_limit or None}
        serve(args.model, args.host, args.port, args.api_keys, **limit)
    elif args.command == "bench":
        return run_bench(args)
    elif args.command == "migrate-index":
        from inferscale_memory.store.migrate import migrate_to_qdrant

        config = MemoryConfig.load(
            args.config, index=args.to, store_path=args.store, qdrant_path=args.qdrant_path,
            qdrant_url=args.qdrant_url, qdrant_api_key=args.qdrant_api_key,
            qdrant_collection=args.collection)
        print(migrate_to_qdrant(config))
    elif args.command == "migrate-store":
        from inferscale_memory.store.migrate import migrate_to_postgres

        config = MemoryConfig.load(args.config, store=args.to, store_path=args.store,
                                   postgres_url=args.postgres_url)
        print(migrate_to_postgres(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())

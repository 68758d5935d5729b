"""Soak test: concurrent clients mix adds, updates, deletes, searches and chats for a while.

Each client is one user. Per interval (a minute by default) the script records every
call's latency and errors, the latency percentiles per operation, and the resident memory
(RSS) of this process and of its children (vLLM's engine processes). It writes a JSON
report and prints a table. Calls that return another user's fact count as errors.

    python scripts/soak.py                         # 8 clients, 10 minutes, HTTP server
    python scripts/soak.py --target python --duration 60
    python scripts/soak.py --url http://host:8000 --key sk-admin --server-pid 1234

Without ``--url`` the script starts the engine (embedded default model, a new store under
the output folder) and, for ``--target http``, the server on 127.0.0.1 in this process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

OPS = {"add": 0.25, "update": 0.15, "delete": 0.10, "search": 0.20, "chat": 0.30}
WORDS = "tea coffee Berlin Lisbon guitar piano cat dog bike boat red blue".split()


class IsolationError(Exception):
    """A call returned a fact of another user."""


class HttpTarget:
    """The calls of one client, through the HTTP API."""

    def __init__(self, url: str, key: str | None, model: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=f"{url.rstrip('/')}/v1", headers=headers, timeout=300)
        self.model = model or self.client.get("/models").raise_for_status().json()["data"][0]["id"]

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = response.text[:80]
            raise RuntimeError(f"HTTP {response.status_code} {code}")
        return response.json()

    def add(self, user: str, text: str) -> str:
        return self._json("POST", "/memories", json={"user_id": user, "text": text})["data"][0][
            "id"
        ]

    def update(self, user: str, fact_id: str, text: str) -> None:
        self._json("PUT", f"/memories/{fact_id}", json={"user_id": user, "text": text})

    def delete(self, user: str, fact_id: str) -> None:
        self._json("DELETE", f"/memories/{fact_id}", params={"user_id": user})

    def search(self, user: str, query: str) -> list[str]:
        data = self._json(
            "POST", "/memories/search", json={"user_id": user, "query": query, "k": 5}
        )["data"]
        return [m["user_id"] for m in data]

    def chat(self, user: str, query: str, max_tokens: int) -> list[str]:
        body = {
            "model": self.model,
            "user": user,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": query}],
            "memory": {"k": 5},
        }
        return list(self._json("POST", "/chat/completions", json=body)["memory"]["fact_ids"])


class PythonTarget:
    """The calls of one client, through the Python API of an engine in this process."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def add(self, user: str, text: str) -> str:
        return str(self.engine.memory.add(text, user_id=user).id)

    def update(self, user: str, fact_id: str, text: str) -> None:
        self.engine.memory.update(fact_id, text, user_id=user)

    def delete(self, user: str, fact_id: str) -> None:
        self.engine.memory.delete(fact_id, user_id=user)

    def search(self, user: str, query: str) -> list[str]:
        return [h.fact.user_id for h in self.engine.memory.search(query, user_id=user, k=5)]

    def chat(self, user: str, query: str, max_tokens: int) -> list[str]:
        reply = self.engine.chat(
            [{"role": "user", "content": query}], user_id=user, k=5, max_tokens=max_tokens
        )
        if any(f.fact.user_id != user for f in reply.facts):
            raise IsolationError(f"{user} got another user's fact")
        return list(reply.metrics.fact_ids)


@dataclass
class Recorder:
    """Every call: (seconds since start, operation, latency in ms, error or None)."""

    start: float = field(default_factory=time.monotonic)
    calls: list[tuple[float, str, float, str | None]] = field(default_factory=list)
    rss: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, own, tree, facts)
    live: dict[str, int] = field(default_factory=dict)  # facts each client holds now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, op: str, began: float, error: str | None) -> None:
        with self.lock:
            self.calls.append((began - self.start, op, (time.monotonic() - began) * 1000, error))

    def sample_rss(self, pid: int) -> None:
        process = psutil.Process(pid)
        own = process.memory_info().rss
        children = sum(_rss(child) for child in process.children(recursive=True))
        facts = sum(self.live.values())
        self.rss.append((time.monotonic() - self.start, own, own + children, facts))


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


def client_loop(
    target: Any,
    user: str,
    seed: int,
    deadline: float,
    recorder: Recorder,
    max_tokens: int,
    max_facts: int = 100,
) -> None:
    """One client: random operations on its own user until ``deadline``.

    A client holds at most ``max_facts`` facts (an add beyond them deletes one instead),
    so a long run reaches a steady state in which memory must stay flat.
    """
    rng = random.Random(seed)
    own: list[str] = []
    stored = False  # a user that never stored a fact is an unknown user (HTTP 404)
    while time.monotonic() < deadline:
        op = rng.choices(list(OPS), weights=list(OPS.values()))[0]
        if not stored or (op in ("update", "delete") and not own):
            op = "add"
        elif op == "add" and len(own) >= max_facts:
            op = "delete"
        sentence = f"{user} likes {rng.choice(WORDS)} and {rng.choice(WORDS)} ({rng.random():.6f})."
        began = time.monotonic()
        error = None
        try:
            if op == "add":
                own.append(target.add(user, sentence))
                stored = True
            elif op == "update":
                target.update(user, rng.choice(own), sentence)
            elif op == "delete":
                target.delete(user, own.pop(rng.randrange(len(own))))
            elif op == "search":
                if set(target.search(user, f"What does {user} like?")) - {user}:
                    raise IsolationError(f"{user} got another user's fact")
            else:
                used = target.chat(user, f"What does {user} like?", max_tokens)
                if own and set(used) - set(own):
                    raise IsolationError(f"{user}'s answer used a fact it does not own")
        except Exception as exc:  # the soak reports every failure instead of stopping
            error = f"{type(exc).__name__}: {exc}"[:200]
        recorder.record(op, began, error)
        recorder.live[user] = len(own)


def summarize(recorder: Recorder, interval: float) -> dict[str, Any]:
    """Per interval and in total: calls, errors and latency percentiles per operation."""
    windows: dict[int, list[tuple[float, str, float, str | None]]] = defaultdict(list)
    for call in recorder.calls:
        windows[int(call[0] // interval)].append(call)
    rows = []
    for index in sorted(windows):
        calls = windows[index]
        rss = [r for r in recorder.rss if r[0] <= (index + 1) * interval]
        rows.append(
            {
                "window": index,
                "from_s": index * interval,
                **_stats(calls),
                "rss_mb": round(rss[-1][1] / 2**20, 1) if rss else None,
                "rss_with_children_mb": round(rss[-1][2] / 2**20, 1) if rss else None,
                "facts": rss[-1][3] if rss else None,
            }
        )
    errors: dict[str, int] = defaultdict(int)
    for _, op, _, error in recorder.calls:
        if error:
            errors[f"{op}: {error}"] += 1
    return {
        "windows": rows,
        "total": _stats(recorder.calls),
        "errors": dict(errors),
        "rss_samples": [
            {
                "t_s": round(t, 1),
                "rss_mb": round(own / 2**20, 1),
                "rss_with_children_mb": round(tree / 2**20, 1),
                "facts": facts,
            }
            for t, own, tree, facts in recorder.rss
        ],
    }


def _stats(calls: list[tuple[float, str, float, str | None]]) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": len(calls), "errors": sum(c[3] is not None for c in calls)}
    for op in ["all", *OPS]:
        ms = [c[2] for c in calls if op in ("all", c[1])]
        if ms:
            p50, p95, p99 = np.percentile(ms, [50, 95, 99])
            out[op] = {
                "n": len(ms),
                "p50_ms": round(p50, 1),
                "p95_ms": round(p95, 1),
                "p99_ms": round(p99, 1),
                "max_ms": round(max(ms), 1),
            }
    return out


def print_table(report: dict[str, Any]) -> None:
    head = (
        f"{'min':>4} {'calls':>6} {'err':>4} {'p50':>7} {'p95':>7} {'p99':>7} "
        f"{'chat p50':>9} {'chat p95':>9} {'RSS MB':>8} {'+children':>10} {'facts':>6}"
    )
    print(head)
    for row in [*report["windows"], {"window": "all", **report["total"]}]:
        every, chat = row.get("all", {}), row.get("chat", {})
        print(
            f"{row['window']!s:>4} {row['calls']:>6} {row['errors']:>4} "
            f"{every.get('p50_ms', '-')!s:>7} {every.get('p95_ms', '-')!s:>7} "
            f"{every.get('p99_ms', '-')!s:>7} {chat.get('p50_ms', '-')!s:>9} "
            f"{chat.get('p95_ms', '-')!s:>9} {row.get('rss_mb', '')!s:>8} "
            f"{row.get('rss_with_children_mb', '')!s:>10} {row.get('facts', '')!s:>6}"
        )
    for error, count in sorted(report["errors"].items(), key=lambda e: -e[1])[:10]:
        print(f"  {count:>5} x {error}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start what is needed, run the clients, return the report."""
    engine = handle = None
    pid = args.server_pid or psutil.Process().pid
    try:
        if args.url is None:
            from inferscale_memory import MemoryEngine

            store = args.store or str(Path(tempfile.mkdtemp(prefix="soak-")) / "soak.sqlite")
            engine = MemoryEngine(store_path=store, max_model_len=4096)
        url = args.url
        if args.target == "http" and url is None:
            from inferscale_memory.server import create_app, start_server

            handle = start_server(create_app(engine, metrics_refresh_s=60), engine)
            url = handle.url
        targets = [
            HttpTarget(url, args.key, args.model) if args.target == "http" else PythonTarget(engine)
            for _ in range(args.clients)
        ]
        recorder = Recorder()
        deadline = recorder.start + args.duration
        run_id = uuid.uuid4().hex[:6]  # fresh users, also on a server with older data
        threads = [
            threading.Thread(
                target=client_loop,
                args=(
                    target,
                    f"soak-{run_id}-{i}",
                    args.seed + i,
                    deadline,
                    recorder,
                    args.max_tokens,
                    args.max_facts,
                ),
            )
            for i, target in enumerate(targets)
        ]
        recorder.sample_rss(pid)
        for thread in threads:
            thread.start()
        next_sample = recorder.start + args.interval
        while any(thread.is_alive() for thread in threads):
            time.sleep(0.2)
            if time.monotonic() >= next_sample:
                recorder.sample_rss(pid)
                next_sample += args.interval
        recorder.sample_rss(pid)
        report = summarize(recorder, args.interval)
        if engine is not None:  # the fact-KV pool's counters (hits, misses, moves)
            report["kv_stats"] = dataclasses.asdict(engine.kv_stats)
    finally:
        if handle is not None:
            handle.stop(timeout=60)
        if engine is not None:
            engine.close()
    report["config"] = {k: v for k, v in vars(args).items() if k != "key"}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds (default 600)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--target", choices=["http", "python"], default="http")
    parser.add_argument("--url", help="a running server (default: start one here)")
    parser.add_argument("--key", help="API key of --url (one that may act for any user)")
    parser.add_argument("--model", help="model id of --url (default: GET /v1/models)")
    parser.add_argument("--server-pid", type=int, help="process whose RSS to record")
    parser.add_argument("--store", help="store file of the engine started here")
    parser.add_argument("--interval", type=float, default=60, help="seconds per row")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-facts", type=int, default=100, help="per client (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="soak.json")
    args = parser.parse_args()
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print_table(report)
    if "kv_stats" in report:
        print("fact-KV pool:", report["kv_stats"])
    print(f"report: {args.out}")


if __name__ == "__main__":
    main()

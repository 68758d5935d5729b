"""``bench index``: search latency and build time of the vector index backends.

Random unit vectors (the embedder's dimension, 384 by default) spread over ``users``
users; queries are random unit vectors searched in the first user. Backends:
``exact`` (in-process numpy), ``qdrant-memory`` (qdrant-client local mode in memory) and
``qdrant-path`` (local mode in a temporary folder, every point persisted), and the fact
stores' own write path: ``sqlite`` (fact rows in a SQLite file, then the exact index: what
an add costs on one machine), ``postgres`` and ``postgres-hnsw`` (fact rows in PostgreSQL,
searched there exactly or through pgvector's HNSW index). The PostgreSQL rows use
``postgres_url`` (``$INFERSCALE_POSTGRES_URL``, a fresh schema per run), or a temporary
server from the ``pgserver`` package. Each row also says how many queries returned exactly
the top-k ids of the exact index.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import statistics
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from inferscale_memory.errors import ConfigError, MissingDependencyError
from inferscale_memory.store.facts import Fact
from inferscale_memory.store.index import ExactIndex, VectorIndex

BACKENDS = ("exact", "qdrant-memory", "qdrant-path", "sqlite", "postgres", "postgres-hnsw")
DEFAULT_BACKENDS = ("exact", "qdrant-memory", "qdrant-path")
BATCH = 1000  # vectors per upsert while building
_schemas = itertools.count()


@dataclass
class IndexRow:
    backend: str
    facts: int
    users: int
    build_s: float
    median_ms: float
    p90_ms: float
    same_as_exact: float  # share of queries whose top-k ids equal the exact index's


@contextlib.contextmanager
def open_backend(name: str, dim: int) -> Iterator[VectorIndex]:
    """A fresh, empty index of backend ``name`` (closed, and its folder removed, on exit)."""
    if name == "exact":
        yield ExactIndex(dim)
        return
    if name not in BACKENDS:
        raise ConfigError(f"unknown index backend {name!r}; choose from {BACKENDS}")
    if name in ("sqlite", "postgres", "postgres-hnsw"):
        with _store_backend(name, dim) as index:
            yield index
        return
    from inferscale_memory.store.qdrant import QdrantIndex

    with contextlib.ExitStack() as stack:
        folder = ":memory:"
        if name == "qdrant-path":
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-index-"))
        index = QdrantIndex(folder, dim=dim)
        stack.callback(index.close)
        yield index


class StoreWrites(VectorIndex):
    """A fact store's write path as an index: an upsert inserts fact rows (one transaction
    per batch, as ``add`` of a list does), then updates the store's search index."""

    def __init__(self, db: Any, index: VectorIndex) -> None:
        self._db = db
        self._index = index

    def upsert(self, user_id: str, ids: Sequence[str], vectors: np.ndarray) -> None:
        now = time.time()
        facts = [Fact(fid, user_id, f"fact {fid}", {}, now, now) for fid in ids]
        with self._db.transaction() as tx:
            tx.insert(facts, vectors)
        self._index.upsert(user_id, ids, vectors)

    def remove(self, user_id: str, ids: Sequence[str]) -> None:
        raise NotImplementedError  # the bench only adds

    def clear(self, user_id: str) -> None:
        raise NotImplementedError

    def search(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        return self._index.search(user_id, vector, k)

    def count(self, user_id: str) -> int:
        return self._index.count(user_id)


@contextlib.contextmanager
def _store_backend(name: str, dim: int) -> Iterator[VectorIndex]:
    from inferscale_memory.store.sqlite import FactDB

    if name == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-index-") as folder:
            db = FactDB(str(Path(folder) / "memory.sqlite"))
            try:
                yield StoreWrites(db, ExactIndex(dim))
            finally:
                db.close()
        return
    from inferscale_memory.store.postgres import PgVectorIndex, PostgresFactDB

    with _postgres_schema() as url:
        pg = PostgresFactDB(url)
        try:
            yield StoreWrites(pg, PgVectorIndex(pg, dim, hnsw=name == "postgres-hnsw"))
        finally:
            pg.close()


@contextlib.contextmanager
def _postgres_schema() -> Iterator[str]:
    """A URL whose tables land in a new schema (dropped on exit) of ``$INFERSCALE_POSTGRES_URL``
    or of a temporary ``pgserver``."""
    import psycopg

    with contextlib.ExitStack() as stack:
        base = os.environ.get("INFERSCALE_POSTGRES_URL")
        if not base:
            try:
                import pgserver
            except ImportError as exc:
                raise MissingDependencyError(
                    "the postgres rows need INFERSCALE_POSTGRES_URL or the pgserver package "
                    "(pip install pgserver)") from exc
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pg-"))
            server = pgserver.get_server(folder, cleanup_mode="stop")
            stack.callback(server.cleanup)
            base = server.get_uri()
        schema = f"bench_{os.getpid()}_{next(_schemas)}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute(f"CREATE SCHEMA {schema}")
        stack.callback(_drop_schema, base, schema)
        options = urllib.parse.quote(f"-csearch_path={schema},public")
        yield f"{base}{'&' if '?' in base else '?'}options={options}"


def _drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """``n`` random float32 unit vectors."""
    out = rng.standard_normal((n, dim)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def run_index_bench(sizes: Sequence[int], backends: Sequence[str] = DEFAULT_BACKENDS, *,
                    dim: int = 384, users: int = 1, queries: int = 50, k: int = 10, seed: int = 0,
                    out: Path | None = None) -> list[IndexRow]:
    """Build each backend at each size, then time ``queries`` searches; one row per pair."""
    rows = []
    for n in sizes:
        rng = np.random.default_rng(seed)
        vectors = unit_vectors(rng, n, dim)
        probes = unit_vectors(rng, queries, dim)
        reference: list[list[str]] | None = None
        for name in backends:
            with open_backend(name, dim) as index:
                build_s = _build(index, vectors, users, f"{name} {n}")
                times, results = _search(index, probes, k)
            reference = results if reference is None and name == "exact" else reference
            same = (sum(a == b for a, b in zip(results, reference, strict=True)) / queries
                    if reference is not None else float("nan"))
            rows.append(IndexRow(name, n, users, build_s, *_stats(times), same))
    if out is not None:
        out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return rows


def _build(index: VectorIndex, vectors: np.ndarray, users: int, label: str) -> float:
    owners = np.arange(len(vectors)) % users
    start = time.perf_counter()
    for user in range(users):
        rows = np.nonzero(owners == user)[0]
        for i in tqdm(range(0, len(rows), BATCH), desc=f"build {label}", leave=False,
                      disable=users > 1):
            chunk = rows[i:i + BATCH]
            index.upsert(f"user{user}", [f"f{j:07d}" for j in chunk], vectors[chunk])
    return time.perf_counter() - start


def _search(index: VectorIndex, probes: np.ndarray,
            k: int) -> tuple[list[float], list[list[str]]]:
    index.search("user0", probes[0], k)  # warm-up
    times, results = [], []
    for probe in probes:
        start = time.perf_counter()
        hits = index.search("user0", probe, k)
        times.append((time.perf_counter() - start) * 1000)
        results.append([fid for fid, _ in hits])
    return times, results


def _stats(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return statistics.median(ordered), p90


def format_table(rows: list[IndexRow]) -> str:
    """A Markdown table of the rows."""
    lines = ["| backend | facts | users | build s | search median ms | search p90 ms "
             "| top-k = exact |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "n/a" if math.isnan(r.same_as_exact) else f"{r.same_as_exact:.0%}"
        lines.append(f"| {r.backend} | {r.facts} | {r.users} | {r.build_s:.2f} "
                     f"| {r.median_ms:.2f} | {r.p90_ms:.2f} | {same} |")
    return "\n".join(lines)

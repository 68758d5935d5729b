"""``bench index``: search latency and build time of the vector index backends.

Random unit vectors (the embedder's dimension, 384 by default) spread over ``users``
tenants; queries are random unit vectors searched in the first tenant. Backends:
``exact`` (in-process numpy), ``qdrant-memory`` (qdrant-client local mode in memory) and
``qdrant-path`` (local mode in a temporary folder, every point persisted). Each row also
says how many queries returned exactly the top-k ids of the exact index.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from inferscale_memory.errors import ConfigError
from inferscale_memory.store.index import ExactIndex, VectorIndex

BACKENDS = ("exact", "qdrant-memory", "qdrant-path")
BATCH = 1000  # vectors per upsert while building


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
    from inferscale_memory.store.qdrant import QdrantIndex

    with contextlib.ExitStack() as stack:
        folder = ":memory:"
        if name == "qdrant-path":
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-index-"))
        index = QdrantIndex(folder, dim=dim)
        stack.callback(index.close)
        yield index


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """``n`` random float32 unit vectors."""
    out = rng.standard_normal((n, dim)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def run_index_bench(sizes: Sequence[int], backends: Sequence[str] = BACKENDS, *, dim: int = 384,
                    users: int = 1, queries: int = 50, k: int = 10, seed: int = 0,
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

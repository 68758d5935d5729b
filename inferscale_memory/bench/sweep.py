"""``bench synthetic`` over several shapes and KV cache dtypes in one invocation: one
report per (shape, dtype), kept in one JSON file, and the table of them all.

A run that fails (a config the library refuses, such as ``kv_cache_dtype="fp8"`` before it
is supported, or an engine that does not start) is recorded with its error and the points
it measured, and the next one runs: one hold of a GPU gives the whole table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferscale_memory.bench.synthetic import pool_details, write_json

logger = logging.getLogger(__name__)
Runner = Callable[..., dict[str, Any]]


def run_sweep(shapes: list[str], kv_cache_dtypes: list[str], out: Path | None,
              run: Runner, **options: Any) -> list[dict[str, Any]]:
    """``run(shape, kv_cache_dtype=..., save=..., **options)`` (:func:`run_synthetic`) for
    every shape and dtype; ``out`` holds ``{"runs": [...]}``, rewritten after every
    measured point of every run."""
    runs: list[dict[str, Any]] = []
    latest: dict[str, Any] = {}  # the running report, as last saved

    def save(report: dict[str, Any]) -> None:
        latest.clear()
        latest.update(report)
        if out is not None:
            write_json(out, {"runs": [*runs, report]})

    for shape in shapes:
        for dtype in kv_cache_dtypes:
            latest.clear()
            try:
                report = run(shape, kv_cache_dtype=dtype, save=save, **options)
            except Exception as exc:  # the next run may still work: record and go on
                logger.error("bench synthetic %s, kv_cache_dtype=%s failed: %s",
                             shape, dtype, exc)
                report = {"shape": shape, **pool_details(
                    shape, dtype, options.get("tensor_parallel_size", 1)), **latest,
                          "complete": False, "error": f"{type(exc).__name__}: {exc}"}
            runs.append(report)
            if out is not None:
                write_json(out, {"runs": runs})
    return runs


def format_sweep(runs: list[dict[str, Any]], ks: list[int]) -> str:
    """One Markdown row per run: pool facts per GiB (computed), capture rates (right after
    the header, then after the run's context facts), vLLM's floor, median TTFT of both
    paths (cold) at each k, throughput of both paths."""
    head = ("| shape | weights | KV cache | facts/GiB | captures/s (with context) "
            "| vLLM floor ms | "
            + " | ".join(f"k={k} text / KV ms" for k in ks)
            + " | req/s text / KV |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in runs:
        lines.append(_row(run, ks))
    return "\n".join(lines)


def _row(run: dict[str, Any], ks: list[int]) -> str:
    cells = [run["shape"], run.get("weights", "-"), run.get("kv_cache_dtype", "-"),
             f"{run['pool']['facts_per_gib']:,}" if "pool" in run else "-"]
    if "error" in run:
        first_line = run["error"].splitlines()[0]
        return "| " + " | ".join(cells) + f" | failed: {first_line} |"
    floor = run.get("vllm_floor")
    captures = f"{run['capture_facts_per_s']:.0f}" if "capture_facts_per_s" in run else "-"
    if "capture_context_facts_per_s" in run:
        captures += f" ({run['capture_context_facts_per_s']:.0f})"
    cells += [captures, f"{floor['median_ms']:.1f}" if floor else "-"]
    by_k = {row["k"]: row for row in run.get("ttft", [])}
    cells += [f"{by_k[k]['text_median_ms']:.1f} / {by_k[k]['kv_median_ms']:.1f}"
              if k in by_k else "-" for k in ks]
    rates = run.get("throughput", {})
    cells.append(f"{rates['text']['requests_per_s']:.1f} / {rates['kv']['requests_per_s']:.1f}"
                 if "text" in rates and "kv" in rates else "-")
    return "| " + " | ".join(cells) + " |"

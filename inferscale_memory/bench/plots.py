"""The benchmark plots (PNG, matplotlib's Agg backend: no display needed).

Each function takes the ``summary.json`` of its workload and writes one small figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from inferscale_memory.errors import MissingDependencyError

COLORS = {"text": "tab:orange", "kv": "tab:blue"}
LABELS = {"text": "text path", "kv": "KV path"}


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependencyError(
            "plots need matplotlib: pip install 'inferscale-memory[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def plot_ttft_vs_k(points: list[dict[str, Any]], path: Path, title: str = "TTFT vs k") -> Path:
    """Median TTFT of both paths over k; the k = 0 median (no memory) as the floor.

    ``points``: ``{"k", "text_median_ms", "kv_median_ms"}`` per k.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ks = [p["k"] for p in points]
    for mode in ("text", "kv"):
        ax.plot(ks, [p[f"{mode}_median_ms"] for p in points], "o-", color=COLORS[mode],
                label=LABELS[mode])
    floor = [p for p in points if p["k"] == 0]
    if floor:
        level = min(floor[0]["text_median_ms"], floor[0]["kv_median_ms"])
        ax.axhline(level, color="grey", linestyle="--", label="k = 0 (no memory)")
    ax.set_xticks(ks)
    ax.set(xlabel="facts in the prompt (k)", ylabel="TTFT, median (ms)", title=title)
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_throughput(summary: dict[str, Any], path: Path) -> Path:
    """Requests/s and TTFT p50 over concurrency, per path and load pattern."""
    plt = _pyplot()
    fig, (rate_ax, ttft_ax) = plt.subplots(1, 2, figsize=(8, 3.4))
    entries = summary["throughput"]
    for mode in ("text", "kv"):
        for pattern, style in (("batch", "o-"), ("closed", "s--")):
            chosen = sorted((e for e in entries if e["mode"] == mode and e["pattern"] == pattern),
                            key=lambda e: e["concurrency"])
            if not chosen:
                continue
            ns = [e["concurrency"] for e in chosen]
            label = f"{LABELS[mode]}, {pattern}"
            rate_ax.plot(ns, [e["requests_per_s"] for e in chosen], style,
                         color=COLORS[mode], label=label)
            ttft_ax.plot(ns, [e["ttft_p50_ms"] for e in chosen], style, color=COLORS[mode],
                         label=label)
    k = summary.get("k")
    for ax in (rate_ax, ttft_ax):
        ax.set_xticks(sorted({e["concurrency"] for e in entries}))
    rate_ax.set(xlabel="concurrent requests", ylabel="requests/s", title=f"throughput, k={k}")
    ttft_ax.set(xlabel="concurrent requests", ylabel="TTFT p50 (ms)", title="TTFT under load")
    for ax in (rate_ax, ttft_ax):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    rate_ax.legend(fontsize=7)
    return _save(fig, path)


def plot_f1_vs_k(summary: dict[str, Any], path: Path) -> Path:
    """LoCoMo F1 of both paths over k (mean over the questions)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    by_k = summary["by_k"]
    ks = [row["k"] for row in by_k]
    for mode in ("text", "kv"):
        ax.plot(ks, [row[mode]["f1"] for row in by_k], "o-", color=COLORS[mode],
                label=LABELS[mode])
    top = max((row[m]["f1"] for row in by_k for m in ("text", "kv")
               if not math.isnan(row[m]["f1"])), default=0.0)
    ax.set_xticks(ks)
    ax.set(xlabel="facts retrieved (k)", ylabel="token F1 (mean)",
           title=f"LoCoMo F1 vs k ({summary.get('questions', '?')} questions)")
    ax.set_ylim(0, max(0.1, top * 1.25))
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def locomo_ttft_points(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The TTFT-vs-k points of a LoCoMo summary."""
    return [{"k": row["k"], "text_median_ms": row["text"]["ttft_median_ms"],
             "kv_median_ms": row["kv"]["ttft_median_ms"]} for row in summary["by_k"]]

"""Where the KV path's answers differ from the text path's, in a quality sweep's run folders.

For each setting (a ``bench locomo`` run folder under ``--out``, as ``quality_sweep.py``
writes them) and each k, three tables of KV - text F1 points (paired, 95% interval):

- **halves**: the whole set, and its two halves by conversation (alternate conversations
  of the run, sorted by id), so that a lever is kept only if it helps on both;
- **evidence**: by where the question's best-ranked evidence fact sat in the prompt: among
  the computed tail (the ``recompute_tail`` best-ranked facts), among the injected ones,
  or not retrieved;
- **divergence**: the share of answers that differ, and the median position of the first
  token where the greedy answers part (on questions where they do).

    python scripts/quality_analysis.py --dataset locomo-dev.json --out /tmp/quality/q1.5b \\
        base t4n4 m4n4 t2n4
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from inferscale_memory.bench.locomo_dataset import load_locomo
from inferscale_memory.bench.run_folder import RunFolder
from inferscale_memory.bench.stats import paired_difference

Pair = tuple[dict[str, Any], dict[str, Any]]  # (kv row, text row) of one question at one k


def pairs(rows: Iterable[dict[str, Any]]) -> dict[int, list[Pair]]:
    """Per k, the (kv, text) rows of each question answered on both paths."""
    by_key: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        by_key[row["conversation"], row["question_index"], row["k"]][row["mode"]] = row
    out: dict[int, list[Pair]] = defaultdict(list)
    for (_, _, k), modes in sorted(by_key.items()):
        if "kv" in modes and "text" in modes:
            out[k].append((modes["kv"], modes["text"]))
    return out


def cell(group: list[Pair]) -> str:
    """``-1.2 (1.4) n=505``: KV - text F1 points, its 95% half-width, the questions."""
    if not group:
        return "-"
    diff, ci = paired_difference([kv["f1"] for kv, _ in group], [t["f1"] for _, t in group])
    width = "" if math.isnan(ci) else f" ({100 * ci:.1f})"  # NaN for one question
    return f"{100 * diff:+.1f}{width} n={len(group)}"


def halves(group: list[Pair]) -> tuple[list[Pair], list[Pair]]:
    """The pairs of alternate conversations (sorted by id): two halves of the set."""
    names = sorted({kv["conversation"] for kv, _ in group})
    first = set(names[0::2])
    return ([p for p in group if p[0]["conversation"] in first],
            [p for p in group if p[0]["conversation"] not in first])


def evidence_rank(kv: dict[str, Any], evidence: dict[tuple[str, int], set[str]]) -> int | None:
    """Rank (0 = best) of the first retrieved fact that holds the question's evidence."""
    wanted = evidence.get((kv["conversation"], kv["question_index"]), set())
    for rank, dia_ids in enumerate(kv.get("retrieved_dia_ids") or []):
        if wanted & set(dia_ids):
            return rank
    return None


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two answers differ (``None``: identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def analyse(run: Path, evidence: dict[tuple[str, int], set[str]]) -> list[str]:
    folder = RunFolder(run)
    tail = folder.config()["params"].get("recompute_tail", 0)
    lines = []
    for k, group in sorted(pairs(folder.rows()).items()):
        first, second = halves(group)
        where: dict[str, list[Pair]] = defaultdict(list)
        for pair in group:
            rank = evidence_rank(pair[0], evidence)
            where["none" if rank is None else "tail" if rank < min(tail, k) else
                  "injected"].append(pair)
        parts = [first_divergence(kv["token_ids"], t["token_ids"]) for kv, t in group]
        moved = [p for p in parts if p is not None]
        lines.append(
            f"| {run.name} | {k} | {cell(group)} | {cell(first)} | {cell(second)} "
            f"| {cell(where['tail'])} | {cell(where['injected'])} | {cell(where['none'])} "
            f"| {len(moved) / max(1, len(parts)):.0%} "
            f"| {statistics.median(moved) if moved else '-'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the sweep's folder")
    parser.add_argument("settings", nargs="+", help="run folder names under --out")
    args = parser.parse_args()
    evidence = {(conv.sample_id, q.index): set(q.evidence)
                for conv in load_locomo(args.dataset) for q in conv.questions}
    print("| setting | k | all | half A | half B | evidence in tail | evidence injected "
          "| not retrieved | answers differ | first different token |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.settings:
        if (args.out / name / "requests.jsonl").exists():
            print("\n".join(analyse(args.out / name, evidence)))


if __name__ == "__main__":
    main()

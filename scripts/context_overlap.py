"""How much of an injected fact's capture context its answer prompt can hold (CPU only).

A fact's KV is captured after its ``--context`` nearest facts in the user's store
(``capture_context``); in an answer prompt it attends to the facts before it there. For
every LoCoMo question and k, with MiniLM retrieval as ``bench locomo`` does it, this
counts per injected fact how many of its capture neighbours sit before it in the prompt's
rank order, in the best order of the injected facts a greedy search finds (the order
lever of docs/quality.md), in the computed tail (after it, whatever the order) and in the
prompt at all.

    python scripts/context_overlap.py --dataset locomo-dev.json --k 10,20,50
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from inferscale_memory.bench.locomo_dataset import load_locomo
from inferscale_memory.embeddings import default_embedder


def before_counts(order: list[int], near: list[set[int]]) -> list[int]:
    """Per fact of ``order``, how many of its neighbours come before it."""
    seen: set[int] = set()
    counts = []
    for fact in order:
        counts.append(len(near[fact] & seen))
        seen.add(fact)
    return counts


def greedy_order(facts: list[int], near: list[set[int]]) -> list[int]:
    """An order of ``facts`` that puts neighbours first: each step takes the fact with
    the most neighbours already placed (ties: the earlier in ``facts``)."""
    placed: set[int] = set()
    order, left = [], list(facts)
    while left:
        best = max(left, key=lambda f: len(near[f] & placed))
        left.remove(best)
        order.append(best)
        placed.add(best)
    return order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--k", default="10,20,50")
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--tail", type=int, default=4)
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    embedder = default_embedder()
    counts: dict[int, list[list[int]]] = {k: [[], [], [], []] for k in ks}
    for conv in load_locomo(args.dataset):
        facts = embedder.embed([f.text for f in conv.facts("observations")])
        similar = facts @ facts.T
        np.fill_diagonal(similar, -np.inf)
        near = [set(np.argsort(-row)[:args.context].tolist()) for row in similar]
        questions = [q.question for q in conv.questions if q.category in (1, 2, 3, 4)]
        for query in embedder.embed(questions):
            ranked = np.argsort(-(facts @ query)).tolist()
            for k in ks:
                prompt = ranked[:k][::-1]  # rank order: the best-ranked fact last
                injected, tail = prompt[:k - args.tail], set(prompt[k - args.tail:])
                retrieved = set(prompt)
                rank, best, in_tail, anywhere = counts[k]
                rank += before_counts(injected, near)
                best += before_counts(greedy_order(injected, near), near)
                in_tail += [len(near[f] & tail) for f in injected]
                anywhere += [len(near[f] & retrieved) for f in injected]
    print(f"| k | of {args.context} capture neighbours: before the fact, rank order | "
          "before it, best order found | in the tail | in the prompt |")
    print("|---|---|---|---|---|")
    for k in ks:
        print(f"| {k} | " + " | ".join(f"{np.mean(c):.2f}" for c in counts[k]) + " |")


if __name__ == "__main__":
    main()

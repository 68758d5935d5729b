"""How many tokens a capture computes once vLLM's prefix cache serves what earlier captures
computed, by the order of the capture context (CPU only, no engine).

A capture's prompt is ``header | context facts | fact`` (``capture_context`` of the user's
nearest facts, in ``capture_context_order``). vLLM caches whole blocks of a prompt's
prefix, chained from the first block: two captures whose contexts begin with the same
facts compute those blocks once. This adds each LoCoMo conversation's facts in order, as
``bench locomo`` does, builds each fact's capture prompt with the model's chat template
and MiniLM neighbours, and counts the tokens each capture computes after the captures
before it (an upper bound on sharing: captures in flight at once share nothing).

    python scripts/capture_sharing.py --dataset locomo-dev.json --tokenizer MODEL_DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from inferscale_memory.bench.locomo_dataset import load_locomo


def computed_tokens(prompts: Iterable[Sequence[int]], block_size: int) -> list[int]:
    """Per prompt, in order, the tokens computed when every whole block of an earlier
    prompt's prefix is cached (chained: a block is a hit only after its parent was; the
    last token is always computed)."""
    # A block's id names its whole prefix: (parent id, its tokens) -> id.
    blocks: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    for ids in prompts:
        parent, hit = -1, 0
        for start in range(0, len(ids) - block_size + 1, block_size):
            key = (parent, tuple(ids[start:start + block_size]))
            if key in blocks and hit == start:
                hit = start + block_size
            parent = blocks.setdefault(key, len(blocks))
        out.append(len(ids) - min(hit, len(ids) - 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--tokenizer", required=True, help="a model folder with its chat template")
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16, help="vLLM's (16 on CUDA)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from inferscale_memory.embeddings import default_embedder
    from inferscale_memory.layout import PromptBuilder

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from recompute_proxy import nearest_contexts  # the engine's neighbours, either order

    builder = PromptBuilder(AutoTokenizer.from_pretrained(args.tokenizer))
    embedder = default_embedder()
    totals: dict[str, list[int]] = {"no context": [], "added": [], "similarity": []}
    lengths: dict[str, list[int]] = {name: [] for name in totals}
    for conv in load_locomo(args.dataset):
        texts = [f.text for f in conv.facts("observations")]
        vectors = np.asarray(embedder.embed(texts))
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        for name in totals:
            near = ([[]] * len(texts) if name == "no context"
                    else nearest_contexts(vectors, args.context, name))
            prompts = [builder.capture_prompt(text, [texts[j] for j in ctx])[0]
                       for text, ctx in zip(texts, near, strict=True)]
            totals[name] += computed_tokens(prompts, args.block_size)
            lengths[name] += [len(p) for p in prompts]
    print(f"| capture context | prompt tokens per capture | computed after the prefix "
          f"cache (blocks of {args.block_size}) | share computed |")
    print("|---|---|---|---|")
    for name, computed in totals.items():
        mean_len, mean_computed = np.mean(lengths[name]), np.mean(computed)
        print(f"| {name} | {mean_len:.1f} | {mean_computed:.1f} | "
              f"{mean_computed / mean_len:.0%} |")


if __name__ == "__main__":
    main()

"""How much of the KV path's answer drift a recompute *inside* the injected facts would
remove: a CPU estimate with the real weights, before anyone builds the attention backend
it needs (docs/quality.md, "Where to look next" 3).

vLLM computes only a contiguous suffix after what a connector loads, so today's levers
are the captured KV itself (``capture_context``) and the computed tail (``recompute_tail``).
CacheBlend and EPIC recompute chosen tokens inside the injected span instead: their K/V
are computed again, layer by layer, attending to the injected KV around them. That needs
a custom attention backend in vLLM. This script measures what it would buy on LoCoMo
prompts, with a model written out in plain torch (the Hugging Face weights of a Qwen2 or
Llama model) so that every path is under control:

- ``text``: the whole prompt computed (the reference);
- ``kv``: the library's default: the header computed, the facts before the tail injected
  as captured after their ``--context`` most similar facts (rotated to their place),
  the last ``--tail`` facts and the question computed;
- ``kv+first``: ``kv`` and the first tokens of each injected fact recomputed (EPIC:
  attention sinks at each chunk start);
- ``kv+dev``: ``kv`` and the injected tokens whose first-layer values deviate most from a
  fresh computation (CacheBlend's selection);
- ``kv+rand``: as many tokens chosen at random (the control);
- ``kv+tail``: the budget spent on a longer computed tail instead (what vLLM allows).

All recompute variants get the same number of tokens (``--share`` of the injected ones).
Per question: the KL divergence of each path's next-token distribution from the text
path's at the first answer token, whether its greedy answer (``--answer-tokens``) equals
the text path's, and LoCoMo F1 against the gold answer. This is an estimate of the gain
on a small model on a CPU, not a quality decision (those are made on the GPU with
``bench locomo`` over the whole development set).

    python scripts/recompute_proxy.py --model HF_FOLDER --dataset locomo-dev.json \\
        --conversations conv-26,conv-30 --questions 40 --k 10 --out proxy.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inferscale_memory.bench.locomo_dataset import load_locomo, select
from inferscale_memory.bench.scoring import locomo_f1
from inferscale_memory.embeddings import default_embedder
from inferscale_memory.layout import PromptBuilder

KV = tuple[list[torch.Tensor], list[torch.Tensor]]  # per layer [n, kv_heads, head_dim]


class PlainModel:
    """A decoder-only RoPE model (Qwen2 / Llama weights) run one layer at a time, with its
    K/V cache as plain per-layer tensors whose positions the caller chooses."""

    def __init__(self, hf: torch.nn.Module) -> None:
        self.hf = hf
        cfg = hf.config
        self.layers = hf.model.layers
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.inv_freq = hf.model.rotary_emb.inv_freq.float()
        self.scaling = hf.model.rotary_emb.attention_scaling

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None, :] * self.scaling
        sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None, :] * self.scaling
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    def shift(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        """Keys rotated at position p moved to p + delta (one more rotation)."""
        if delta == 0:
            return keys
        angles = float(delta) * self.inv_freq
        cos = torch.cat((angles.cos(), angles.cos()))[None, None, :]
        sin = torch.cat((angles.sin(), angles.sin()))[None, None, :]
        x1, x2 = keys.chunk(2, dim=-1)
        return keys * cos + torch.cat((-x2, x1), -1) * sin

    def _qkv(self, layer: torch.nn.Module, h: torch.Tensor, positions: torch.Tensor):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        n = x.shape[0]
        q = attn.q_proj(x).view(n, self.heads, self.head_dim)
        k = attn.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = attn.v_proj(x).view(n, self.kv_heads, self.head_dim)
        return self.rope(q, positions), self.rope(k, positions), v

    def _attend(self, layer: torch.nn.Module, h: torch.Tensor, q: torch.Tensor,
                keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """``h`` after one layer: attention of ``q`` over ``keys``/``values`` where
        ``visible`` (``[n, m]`` bool) allows, then the MLP."""
        group = self.heads // self.kv_heads
        k = keys.repeat_interleave(group, dim=1)  # [m, heads, d]
        v = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v).reshape(h.shape[0], -1)
        h = h + layer.self_attn.o_proj(out)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(self.hf.model.norm(h))

    @torch.no_grad()
    def forward(self, ids: list[int], start: int, past: KV | None = None
                ) -> tuple[torch.Tensor, KV]:
        """Compute ``ids`` at positions ``start..`` after ``past`` (positions
        ``0..start-1``); the last token's logits and the new tokens' K/V."""
        positions = torch.arange(start, start + len(ids))
        h = self.hf.model.embed_tokens(torch.tensor(ids))
        n, m = len(ids), start
        visible = torch.ones(n, m + n, dtype=torch.bool)
        visible[:, m:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, positions)
            keys = k if past is None else torch.cat((past[0][i], k))
            values = v if past is None else torch.cat((past[1][i], v))
            h = self._attend(layer, h, q, keys, values, visible)
            new_k.append(k)
            new_v.append(v)
        return self.logits(h[-1]), (new_k, new_v)

    @torch.no_grad()
    def recompute(self, ids: list[int], past: KV, chosen: list[int]) -> KV:
        """``past`` (positions ``0..len(ids)-1``, the tokens ``ids``) with the K/V of the
        ``chosen`` positions computed again, layer by layer: each chosen token attends to
        the cache as it stands (injected K/V elsewhere, recomputed K/V at chosen
        positions), as CacheBlend's selective recompute does."""
        if not chosen:
            return past
        keys = [k.clone() for k in past[0]]
        values = [v.clone() for v in past[1]]
        at = torch.tensor(chosen)
        h = self.hf.model.embed_tokens(torch.tensor([ids[p] for p in chosen]))
        visible = torch.arange(len(ids))[None, :] <= at[:, None]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, at)
            keys[i][at], values[i][at] = k, v
            h = self._attend(layer, h, q, keys[i], values[i], visible)
        return keys, values

    @torch.no_grad()
    def deviation(self, ids: list[int], past: KV, positions: list[int]) -> torch.Tensor:
        """Per position, how far the second layer's K/V in ``past`` are from the ones a
        full computation gives (CacheBlend's selection): the first layer's K/V depend on
        the token alone, so one layer recomputed over the cache yields the exact input of
        the second."""
        at = torch.tensor(positions)
        visible = torch.arange(len(ids))[None, :] <= at[:, None]
        layer = self.layers[0]
        h = self.hf.model.embed_tokens(torch.tensor([ids[p] for p in positions]))
        q, _, _ = self._qkv(layer, h, at)
        h = self._attend(layer, h, q, past[0][0], past[1][0], visible)
        _, k, v = self._qkv(self.layers[1], h, at)
        return ((k - past[0][1][at]).norm(dim=(1, 2)) / past[0][1][at].norm(dim=(1, 2))
                + (v - past[1][1][at]).norm(dim=(1, 2)) / past[1][1][at].norm(dim=(1, 2)))

    @torch.no_grad()
    def greedy(self, logits: torch.Tensor, past: KV, length: int, count: int) -> list[int]:
        """``count`` greedy tokens after a prompt of ``length`` tokens."""
        out = [int(logits.argmax())]
        keys, values = list(past[0]), list(past[1])
        for step in range(count - 1):
            logits, (k, v) = self.forward(out[-1:], length + step, (keys, values))
            keys = [torch.cat((a, b)) for a, b in zip(keys, k, strict=True)]
            values = [torch.cat((a, b)) for a, b in zip(values, v, strict=True)]
            out.append(int(logits.argmax()))
        return out


def check(hf: torch.nn.Module, model: PlainModel, builder: PromptBuilder) -> None:
    """The plain model computes what the Hugging Face model computes, and a fact captured
    after the header alone, injected where it was captured, answers as the text does."""
    layout = builder.build([{"role": "user", "content": "Where does Priya live?"}],
                           [("a", "Priya lives in Lisbon."), ("b", "Priya plays the cello.")])
    ids = layout.token_ids
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1]
    got, kv = model.forward(ids, 0)
    assert torch.allclose(got, want, atol=2e-3, rtol=1e-3), float((got - want).abs().max())
    _, start, end = layout.fact_spans[0]
    cap_ids, cap_start, cap_end = builder.capture_prompt("Priya lives in Lisbon.")
    _, (k, v) = model.forward(cap_ids[:cap_end], 0)
    assert (cap_start, cap_end) == (start, end)
    past = concat(([x[:start] for x in kv[0]], [x[:start] for x in kv[1]]),
                  ([x[cap_start:cap_end] for x in k], [x[cap_start:cap_end] for x in v]))
    injected, _ = model.forward(ids[end:], end, past)
    assert kl(got, injected) < 1e-6, kl(got, injected)
    moved = ([model.shift(x, 5) for x in k], v)  # rotations compose: 5 forward, 5 back
    back = [model.shift(x, -5) for x in moved[0]]
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(back, k, strict=True))


def concat(*parts: KV) -> KV:
    layers = len(parts[0][0])
    return ([torch.cat([p[0][i] for p in parts]) for i in range(layers)],
            [torch.cat([p[1][i] for p in parts]) for i in range(layers)])


def kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    p = reference.float().log_softmax(-1)
    q = other.float().log_softmax(-1)
    return float((p.exp() * (p - q)).sum())


@dataclass
class Captures:
    """Each fact's captured K/V (after its context), by fact index, and where it sat."""

    model: PlainModel
    builder: PromptBuilder
    texts: list[str]
    contexts: dict[int, list[int]]
    store: dict[int, tuple[KV, int]] = field(default_factory=dict)

    def get(self, index: int) -> tuple[KV, int]:
        if index not in self.store:
            ids, start, end = self.builder.capture_prompt(
                self.texts[index], [self.texts[c] for c in self.contexts[index]])
            _, (k, v) = self.model.forward(ids[:end], 0)
            self.store[index] = (([x[start:end] for x in k], [x[start:end] for x in v]), start)
        return self.store[index]


def nearest_contexts(vectors: np.ndarray, count: int) -> dict[int, list[int]]:
    """Per fact, its ``count`` most similar facts (cosine), in the order they were added."""
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    order = np.argsort(-sims, axis=1)[:, :count]
    return {i: sorted(int(j) for j in row) for i, row in enumerate(order)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face folder (Qwen2/Llama)")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--conversations", default=None, help="comma-separated sample ids")
    parser.add_argument("--questions", type=int, default=40, help="per conversation")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--tail", type=int, default=4)
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.15,
                        help="recomputed share of the injected tokens")
    parser.add_argument("--answer-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    model = PlainModel(hf)
    builder = PromptBuilder(tokenizer)
    check(hf, model, builder)
    embedder = default_embedder()
    which = args.conversations.split(",") if args.conversations else None
    conversations = select(load_locomo(args.dataset), which)
    rows: list[dict] = []
    started = time.monotonic()
    for conv in conversations:
        facts = list(conv.facts("observations"))
        texts = [f.text for f in facts]
        vectors = embedder.embed(texts)
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        captures = Captures(model, builder, texts, nearest_contexts(vectors, args.context))
        questions = [q for q in conv.questions if q.category in (1, 2, 3, 4)]
        rng.shuffle(questions)
        for question in questions[:args.questions]:
            rows.append(run_question(model, tokenizer, builder, captures, vectors, embedder,
                                     question, texts, args, rng))
            rows[-1]["conversation"] = conv.sample_id
            print(json.dumps({k: rows[-1][k] for k in ("conversation", "kl", "same")}),
                  f"{time.monotonic() - started:.0f} s", flush=True)
    summary = summarize(rows)
    Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary,
                                          "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


def run_question(model: PlainModel, tokenizer, builder: PromptBuilder, captures: Captures,
                 vectors: np.ndarray, embedder, question, texts: list[str],
                 args: argparse.Namespace, rng: random.Random) -> dict:
    q = embedder.embed([question.question])[0]
    q = q / np.linalg.norm(q)
    ranked = list(np.argsort(-(vectors @ q))[:args.k])  # best first
    order = [int(i) for i in reversed(ranked)]  # rank order: best last
    messages = [{"role": "user", "content": question.question}]
    layout = builder.build(messages, [(str(i), texts[i]) for i in order])
    ids = layout.token_ids
    header = layout.header_end
    tail = min(args.tail, len(order))
    injected = order[:len(order) - tail]
    spans = layout.fact_spans
    inject_end = spans[len(injected) - 1][2] if injected else header

    # text: every token computed
    text_logits, text_kv = model.forward(ids, 0)
    header_kv = ([k[:header] for k in text_kv[0]], [v[:header] for v in text_kv[1]])
    text_answer = model.greedy(text_logits, text_kv, len(ids), args.answer_tokens)

    # the injected span as the default injects it
    parts = [header_kv]
    for (_id, start, _end), index in zip(spans, injected, strict=False):
        (k, v), captured_at = captures.get(index)
        parts.append(([model.shift(x, start - captured_at) for x in k], list(v)))
    injected_kv = concat(*parts)
    positions = [p for _, s, e in spans[:len(injected)] for p in range(s, e)]
    budget = max(1, round(args.share * len(positions))) if positions else 0

    def finish(past: KV, compute_from: int) -> tuple[torch.Tensor, list[int]]:
        logits, new = model.forward(ids[compute_from:], compute_from, past)
        full = concat(past, new)
        return logits, model.greedy(logits, full, len(ids), args.answer_tokens)

    paths: dict[str, tuple[torch.Tensor, list[int]]] = {}
    paths["kv"] = finish(injected_kv, inject_end)
    if budget:
        firsts: list[int] = []
        depth = 0
        while len(firsts) < budget:  # the first tokens of every fact, level by level
            level = [s + depth for _, s, e in spans[:len(injected)] if s + depth < e]
            if not level:
                break
            firsts += level[:budget - len(firsts)]
            depth += 1
        deviation = model.deviation(ids[:inject_end], injected_kv, positions)
        top = [positions[int(i)] for i in deviation.argsort(descending=True)[:budget]]
        chosen = {"kv+first": sorted(firsts), "kv+dev": sorted(top),
                  "kv+rand": sorted(rng.sample(positions, budget))}
        for name, picks in chosen.items():
            paths[name] = finish(model.recompute(ids[:inject_end], injected_kv, picks),
                                 inject_end)
        # the same tokens spent on a longer computed tail (whole facts, from the end)
        more, extra = 0, len(injected)
        while extra > 0 and more < budget:
            extra -= 1
            more += spans[extra][2] - spans[extra][1]
        cut = spans[extra][1] if extra < len(injected) else inject_end
        paths["kv+tail"] = finish(concat(*parts[:1 + extra]), cut)
    row: dict = {"question": question.index, "category": question.category,
                 "injected_tokens": len(positions), "budget": budget,
                 "kl": {}, "same": {}, "f1": {}}
    def f1(answer: list[int]) -> float:
        text = tokenizer.decode(answer, skip_special_tokens=True).split("\n")[0]
        return locomo_f1(text, question.answer, question.category)

    row["f1"]["text"] = f1(text_answer)
    for name, (logits, answer) in paths.items():
        row["kl"][name] = kl(text_logits, logits)
        row["same"][name] = answer == text_answer
        row["f1"][name] = f1(answer)
    return row


def summarize(rows: list[dict]) -> dict:
    names = list(rows[0]["kl"]) if rows else []
    out = {"questions": len(rows)}
    for name in names:
        kls = [r["kl"][name] for r in rows if name in r["kl"]]
        out[name] = {
            "kl_mean": statistics.fmean(kls), "kl_median": statistics.median(kls),
            "same_answer": statistics.fmean(r["same"][name] for r in rows if name in r["same"]),
            "f1_minus_text": statistics.fmean(r["f1"][name] - r["f1"]["text"]
                                              for r in rows if name in r["f1"]),
        }
    return out


if __name__ == "__main__":
    main()

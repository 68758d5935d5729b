"""How much of the KV path's answer drift a recompute *inside* the injected facts would
remove, measured with the real weights before anyone builds the attention backend it needs
(docs/quality.md, "A recompute inside the injected facts").

vLLM computes only a contiguous suffix after what a connector loads, so today's levers
are the captured KV itself (``capture_context``) and the computed tail (``recompute_tail``).
CacheBlend and EPIC recompute chosen tokens inside the injected span instead: their K/V
are computed again, layer by layer, attending to the injected KV around them. That needs
a custom attention backend in vLLM. This script measures what it would buy on LoCoMo
prompts, with a model written out in plain torch (the Hugging Face weights of a Qwen2 or
Llama model) so that every path is under control. The reference is ``text`` (the whole
prompt computed); every other path is a *variant*:

- ``t4``: the library's default: the header computed, the facts before the last 4
  injected as captured after their ``--context`` most similar facts (rotated to their
  place), the last 4 facts and the question computed (``t0``: every fact injected);
- ``t4+d15%``: ``t4`` and 15% of the injected tokens recomputed, those whose second-layer
  K/V deviate most from a fresh computation (CacheBlend's selection; ``t2+d64``: a tail
  of 2 and 64 tokens);
- ``+f``: the first tokens of each injected fact (EPIC: attention sinks at chunk starts),
  level by level; ``+r``: tokens at random (the control); ``+T``: the same budget spent on
  whole facts more in the computed tail (what vLLM allows today).

Per question and k: the KL divergence of each path's first answer token from the text
path's, whether its greedy answer (up to ``--answer-tokens``, ended by the end-of-turn
token as the engine's answers are) equals the text path's, LoCoMo F1 against the gold
answer, and the tokens each path computes. The greedy answers of all paths of a question
are decoded as one batch. On a GPU (``--device cuda``, float32) it covers the whole
development set; on the CPU a sample.

The retrieval (each question's top facts and each fact's capture context, by MiniLM, as
the engine's memory finds them) is computed once into ``--retrieval`` and read from there
on a machine without the embedder. Rows are appended to ``--out`` (JSON lines) as they
are made; ``--summarize`` prints the tables of finished runs.

    python scripts/recompute_proxy.py --model HF_FOLDER --dataset locomo-dev.json \\
        --retrieval retrieval.json --k 10 --variants t4,t4+d15%,t4+T15% --out rows.jsonl
    python scripts/recompute_proxy.py --summarize rows-*.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inferscale_memory.bench.locomo import question_messages
from inferscale_memory.bench.locomo_dataset import load_locomo, select
from inferscale_memory.bench.run_folder import json_lines
from inferscale_memory.bench.scoring import locomo_f1
from inferscale_memory.bench.stats import paired_difference
from inferscale_memory.fields import CONTEXT_ORDERS, in_context_order
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
        self.device = self.inv_freq.device

    def tensor(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, device=self.device)

    def embed(self, ids: list[int]) -> torch.Tensor:
        return self.hf.model.embed_tokens(self.tensor(ids))

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
        positions = torch.arange(start, start + len(ids), device=self.device)
        h = self.embed(ids)
        n, m = len(ids), start
        visible = torch.ones(n, m + n, dtype=torch.bool, device=self.device)
        visible[:, m:] = torch.tril(visible[:, m:])
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
        at = self.tensor(chosen)
        h = self.embed([ids[p] for p in chosen])
        visible = torch.arange(len(ids), device=self.device)[None, :] <= at[:, None]
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
        at = self.tensor(positions)
        visible = torch.arange(len(ids), device=self.device)[None, :] <= at[:, None]
        layer = self.layers[0]
        h = self.embed([ids[p] for p in positions])
        q, _, _ = self._qkv(layer, h, at)
        h = self._attend(layer, h, q, past[0][0], past[1][0], visible)
        _, k, v = self._qkv(self.layers[1], h, at)
        return ((k - past[0][1][at]).norm(dim=(1, 2)) / past[0][1][at].norm(dim=(1, 2))
                + (v - past[1][1][at]).norm(dim=(1, 2)) / past[1][1][at].norm(dim=(1, 2)))

    @torch.no_grad()
    def greedy(self, logits: torch.Tensor, pasts: list[KV], length: int, count: int,
               stop: set[int]) -> list[list[int]]:
        """Up to ``count`` greedy tokens after each of ``len(pasts)`` prompts of ``length``
        tokens (``logits``: their last token's, ``[paths, vocab]``), decoded as one batch;
        an answer ends before its first ``stop`` token."""
        paths, group = len(pasts), self.heads // self.kv_heads
        keys, values = [], []
        for i in range(len(self.layers)):
            for cache, part in ((keys, 0), (values, 1)):
                room = torch.empty(paths, length + count, self.kv_heads, self.head_dim,
                                   dtype=pasts[0][part][i].dtype, device=self.device)
                room[:, :length] = torch.stack([p[part][i] for p in pasts])
                cache.append(room)
        tokens = logits.argmax(-1)
        out: list[list[int]] = [[] for _ in range(paths)]
        done = [False] * paths
        for step in range(count):
            for j, token in enumerate(tokens.tolist()):
                done[j] = done[j] or token in stop
                if not done[j]:
                    out[j].append(token)
            if all(done) or step == count - 1:
                break
            at = length + step
            h = self.hf.model.embed_tokens(tokens)
            positions = torch.full((paths,), at, device=self.device)
            for i, layer in enumerate(self.layers):
                q, k, v = self._qkv(layer, h, positions)
                keys[i][:, at], values[i][:, at] = k, v
                kk = keys[i][:, :at + 1].repeat_interleave(group, dim=2)
                vv = values[i][:, :at + 1].repeat_interleave(group, dim=2)
                scores = torch.einsum("bhd,bmhd->bhm", q, kk) / math.sqrt(self.head_dim)
                mixed = torch.einsum("bhm,bmhd->bhd", scores.softmax(-1), vv)
                h = h + layer.self_attn.o_proj(mixed.reshape(paths, -1))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            tokens = self.logits(h).argmax(-1)
        return out


def check(hf: torch.nn.Module, model: PlainModel, builder: PromptBuilder) -> None:
    """The plain model computes what the Hugging Face model computes, and a fact captured
    after the header alone, injected where it was captured, answers as the text does."""
    layout = builder.build([{"role": "user", "content": "Where does Priya live?"}],
                           [("a", "Priya lives in Lisbon."), ("b", "Priya plays the cello.")])
    ids = layout.token_ids
    with torch.no_grad():
        want = hf(model.tensor([ids])).logits[0, -1]
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
    # the batched greedy decodes as Hugging Face's does, whatever else is in the batch
    with torch.no_grad():
        generated = hf.generate(model.tensor([ids]), max_new_tokens=6, do_sample=False,
                                attention_mask=torch.ones_like(model.tensor([ids])))
    want_answer = generated[0, len(ids):].tolist()
    answers = model.greedy(torch.stack((got, injected)), [kv, kv], len(ids), 6, set())
    assert answers[0] == want_answer, (answers[0], want_answer)
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
    contexts: list[list[int]]
    store: dict[int, tuple[KV, int]] = field(default_factory=dict)

    def get(self, index: int) -> tuple[KV, int]:
        if index not in self.store:
            ids, start, end = self.builder.capture_prompt(
                self.texts[index], [self.texts[c] for c in self.contexts[index]])
            _, (k, v) = self.model.forward(ids[:end], 0)
            self.store[index] = (([x[start:end] for x in k], [x[start:end] for x in v]), start)
        return self.store[index]


VARIANT = re.compile(r"t(\d+)(?:\+([dfrT])(\d+)(%?))?$")
PICKS = {"d": "the most deviating tokens", "f": "the first tokens of each fact",
         "r": "random tokens", "T": "whole facts more in the tail"}


@dataclass(frozen=True)
class Variant:
    """A KV path: a computed tail of ``tail`` facts and, optionally, ``amount`` tokens (or
    percent of the injected ones) chosen by ``pick`` recomputed inside the injected span."""

    name: str
    tail: int
    pick: str | None = None
    amount: int = 0
    percent: bool = False

    @classmethod
    def parse(cls, name: str) -> Variant:
        match = VARIANT.match(name)
        if match is None:
            raise SystemExit(f"variant {name!r}: want tN, tN+dM or tN+dM% (picks: "
                             + ", ".join(f"{p} = {what}" for p, what in PICKS.items()) + ")")
        tail, pick, amount, percent = match.groups()
        return cls(name, int(tail), pick, int(amount or 0), percent == "%")

    def budget(self, injected_tokens: int) -> int:
        if self.pick is None or not injected_tokens:
            return 0
        if self.percent:
            return max(1, round(self.amount / 100 * injected_tokens))
        return min(self.amount, injected_tokens)


def nearest_contexts(vectors: np.ndarray, count: int,
                     order: str = "added") -> list[list[int]]:
    """Per fact, its ``count`` most similar facts (cosine), in the order they were added,
    or (``order="similarity"``) least similar first, as the engine's
    ``capture_context_order`` puts them."""
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    nearest = np.argsort(-sims, axis=1, kind="stable")[:, :count]
    return [in_context_order([int(j) for j in row], order, added=int) for row in nearest]


def questions_of(conv) -> list:
    return [q for q in conv.questions if q.category in (1, 2, 3, 4)]


def questions_in_order(conversations: list, per_conversation: int,
                       rng: random.Random) -> list[tuple[str, object]]:
    """Every conversation's questions (``per_conversation`` of each, 0: all) in one shuffled
    order: a run cut short still covers every conversation, so both halves of the set."""
    jobs = []
    for conv in conversations:
        questions = questions_of(conv)
        rng.shuffle(questions)
        jobs += [(conv.sample_id, q) for q in questions[:per_conversation or None]]
    rng.shuffle(jobs)
    return jobs


def shard(jobs: list, which: str) -> list:
    """``which`` "I/N": the I-th of N interleaved shares of ``jobs`` (0-based), so N processes
    with the same seed answer every question once between them; "0/1": all of them."""
    index, _, count = which.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise SystemExit(f"--shard wants I/N with 0 <= I < N, not {which!r}")
    return jobs[int(index)::int(count)]


def finished(out: Path) -> set[tuple[str, int, int]]:
    """The (conversation, question, k) rows ``out`` already holds (none if it is missing),
    so that a run started again with the same ``--out`` answers only the rest. A line cut
    off by a killed process is not a row: it is dropped from the file, so the question is
    answered again and the file stays JSON lines."""
    rows = json_lines(out)
    if out.exists() and len(rows) < len(out.read_text().splitlines()):
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {(r["conversation"], r["question"], r["k"]) for r in rows}


def retrieval(path: Path, conversations: list, context: int, k: int) -> dict:
    """Per conversation, each fact's capture context and each question's top ``k`` facts
    (best first), by the default embedder; computed once and kept in ``path``."""
    if path.exists():
        found = json.loads(path.read_text())
        if found["context"] != context or found["k"] < k:
            raise SystemExit(f"{path} holds context {found['context']}, k {found['k']}")
        return found["conversations"]
    from inferscale_memory.embeddings import default_embedder

    embedder = default_embedder()
    out = {}
    for conv in conversations:
        texts = [f.text for f in conv.facts("observations")]
        vectors = np.asarray(embedder.embed(texts))
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        asked = questions_of(conv)
        queries = np.asarray(embedder.embed([q.question for q in asked]))
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        ranked = {str(q.index): [int(i) for i in np.argsort(-(vectors @ v))[:k]]
                  for q, v in zip(asked, queries, strict=True)}
        out[conv.sample_id] = {"contexts": nearest_contexts(vectors, context),
                               "contexts_similarity": nearest_contexts(
                                   vectors, context, "similarity"),
                               "ranked": ranked}
    path.write_text(json.dumps({"context": context, "k": k, "conversations": out}))
    return out


def contexts_of(found: dict, order: str) -> list[list[int]]:
    """A conversation's capture contexts in ``order`` from its retrieval record."""
    key = "contexts_similarity" if order == "similarity" else "contexts"
    if key not in found:
        raise SystemExit("the retrieval file predates --context-order similarity: "
                         "write it again (remove it)")
    return found[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summarize", nargs="+", metavar="ROWS", help="print the tables")
    parser.add_argument("--model", help="a Hugging Face folder (Qwen2/Llama)")
    parser.add_argument("--dataset")
    parser.add_argument("--retrieval", help="the retrieval file (written if missing)")
    parser.add_argument("--conversations", default=None, help="comma-separated sample ids")
    parser.add_argument("--questions", type=int, default=0,
                        help="per conversation, drawn with --seed (0: all)")
    parser.add_argument("--k", default="10", help="comma-separated")
    parser.add_argument("--variants", default="t4,t4+d15%,t4+f15%,t4+r15%,t4+T15%")
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--context-order", choices=CONTEXT_ORDERS, default="added",
                        help="the order of each fact's capture context (the engine's "
                             "capture_context_order)")
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", default="0/1",
                        help="I/N: this process's share of the questions (same --seed in all)")
    parser.add_argument("--out", help="rows, JSON lines (appended)")
    args = parser.parse_args()
    if args.summarize:
        for line in summarize([json.loads(line) for name in args.summarize
                               for line in Path(name).read_text().splitlines()]):
            print(line)
        return
    if not (args.model and args.dataset and args.retrieval and args.out):
        parser.error("--model, --dataset, --retrieval and --out are required")
    variants = [Variant.parse(v) for v in args.variants.split(",")]
    ks = [int(k) for k in args.k.split(",")]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    which = args.conversations.split(",") if args.conversations else None
    conversations = select(load_locomo(args.dataset), which)
    found = retrieval(Path(args.retrieval), conversations, args.context, max(ks))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model = PlainModel(hf.to(args.device).eval())
    builder = PromptBuilder(tokenizer)
    check(hf, model, builder)
    stop = {t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"),
                        tokenizer.convert_tokens_to_ids("<|eot_id|>")) if isinstance(t, int)}
    started = time.monotonic()
    jobs = shard(questions_in_order(conversations, args.questions, rng), args.shard)
    captures = {conv.sample_id: Captures(model, builder,  # computed as facts are asked for
                                         [f.text for f in conv.facts("observations")],
                                         contexts_of(found[conv.sample_id],
                                                     args.context_order))
                for conv in conversations}
    done = finished(Path(args.out))  # a run started again goes on where it ended
    with Path(args.out).open("a") as out:
        for sample_id, question in jobs:
            mine = captures[sample_id]
            for k in ks:
                if (sample_id, question.index, k) in done:
                    continue
                ranked = found[sample_id]["ranked"][str(question.index)][:k]
                row = run_question(model, tokenizer, builder, mine, ranked, question,
                                   mine.texts, k, variants, args.answer_tokens, stop, rng)
                row.update(conversation=sample_id, model=Path(args.model).name)
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(sample_id, question.index, k,
                      {v: round(x, 4) for v, x in row["kl"].items()},
                      f"{time.monotonic() - started:.0f} s", flush=True)


def run_question(model: PlainModel, tokenizer, builder: PromptBuilder, captures: Captures,
                 ranked: list[int], question, texts: list[str], k: int,
                 variants: list[Variant], answer_tokens: int, stop: set[int],
                 rng: random.Random) -> dict:
    order = list(reversed(ranked))  # rank order: best last
    layout = builder.build(question_messages(question), [(str(i), texts[i]) for i in order])
    ids = layout.token_ids
    header, spans = layout.header_end, layout.fact_spans

    text_logits, text_kv = model.forward(ids, 0)
    header_kv = ([x[:header] for x in text_kv[0]], [x[:header] for x in text_kv[1]])
    parts = [header_kv]  # the header, then each fact as captured, moved to its place
    for (_id, start, _end), index in zip(spans, order, strict=True):
        (keys, values), captured_at = captures.get(index)
        parts.append(([model.shift(x, start - captured_at) for x in keys], list(values)))

    def finish(past: KV, compute_from: int) -> tuple[torch.Tensor, KV]:
        logits, new = model.forward(ids[compute_from:], compute_from, past)
        return logits, concat(past, new)

    logits, pasts = [text_logits], [text_kv]
    row: dict = {"question": question.index, "category": question.category, "k": k,
                 "prompt_tokens": len(ids), "computed": {}, "kl": {}, "same": {}, "f1": {}}
    deviations: dict[int, torch.Tensor] = {}
    for variant in variants:
        injected = len(order) - min(variant.tail, len(order))
        inject_end = spans[injected - 1][2] if injected else header
        past = concat(*parts[:1 + injected])
        positions = [p for _, s, e in spans[:injected] for p in range(s, e)]
        budget = variant.budget(len(positions))
        compute_from, picks = inject_end, []
        if variant.pick == "T":  # whole facts more in the tail, from the end
            more, extra = 0, injected
            while extra > 0 and more < budget:
                extra -= 1
                more += spans[extra][2] - spans[extra][1]
            compute_from = spans[extra][1] if extra < injected else inject_end
            past = concat(*parts[:1 + extra])
        elif variant.pick == "d" and budget:
            if injected not in deviations:
                deviations[injected] = model.deviation(ids[:inject_end], past, positions)
            top = deviations[injected].argsort(descending=True)[:budget]
            picks = sorted(positions[int(i)] for i in top)
        elif variant.pick == "f":  # the first tokens of every fact, level by level
            depth = 0
            while len(picks) < budget:
                level = [s + depth for _, s, e in spans[:injected] if s + depth < e]
                if not level:
                    break
                picks += level[:budget - len(picks)]
                depth += 1
            picks.sort()
        elif variant.pick == "r":
            picks = sorted(rng.sample(positions, budget))
        if picks:
            past = model.recompute(ids[:inject_end], past, picks)
        got, full = finish(past, compute_from)
        logits.append(got)
        pasts.append(full)
        row["computed"][variant.name] = len(ids) - compute_from + len(picks)
    answers = model.greedy(torch.stack(logits), pasts, len(ids), answer_tokens, stop)

    def f1(answer: list[int]) -> float:
        return locomo_f1(tokenizer.decode(answer, skip_special_tokens=True),
                         question.answer, question.category)

    row["f1"]["text"] = f1(answers[0])
    for variant, got, answer in zip(variants, logits[1:], answers[1:], strict=True):
        row["kl"][variant.name] = kl(text_logits, got)
        row["same"][variant.name] = answer == answers[0]
        row["f1"][variant.name] = f1(answer)
    return row


def cell(rows: list[dict], name: str, reference: str = "text") -> str:
    """``-1.2 (1.4)``: the variant's F1 - the reference's (the text path's) in points and
    its paired 95% half-width."""
    if not rows:
        return "-"
    diff, ci = paired_difference([r["f1"][name] for r in rows],
                                 [r["f1"][reference] for r in rows])
    return f"{100 * diff:+.1f}" + ("" if math.isnan(ci) else f" ({100 * ci:.1f})")


def summarize(rows: list[dict]) -> list[str]:
    """Per model and k, per variant: F1 - text on all rows and on each half of the set
    (alternate conversations), F1 - the first variant's, the KL medians and their ratio
    to the first variant's, the share of answers equal to the text path's, and the tokens
    computed."""
    lines = ["| model | k | n | variant | F1 - text | half A | half B | F1 - first "
             "| KL median | KL / first (median) | same answer | computed tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["model"], row["k"])].append(row)
    for (model, k), group in sorted(groups.items()):
        names = sorted({r["conversation"] for r in group})
        first_half = set(names[0::2])
        half_a = [r for r in group if r["conversation"] in first_half]
        half_b = [r for r in group if r["conversation"] not in first_half]
        variants = list(group[0]["kl"])
        text_f1 = statistics.fmean(r["f1"]["text"] for r in group)
        lines.append(f"| {model} | {k} | {len(group)} | text (F1 {100 * text_f1:.1f}) "
                     "| | | | | | | | |")
        for name in variants:
            ratio = statistics.median(r["kl"][name] / max(r["kl"][variants[0]], 1e-12)
                                      for r in group)
            lines.append(
                f"| | | | {name} | {cell(group, name)} | {cell(half_a, name)} "
                f"| {cell(half_b, name)} "
                f"| {cell(group, name, variants[0]) if name != variants[0] else ''} "
                f"| {statistics.median(r['kl'][name] for r in group):.4f} "
                f"| {ratio:.2f} | {statistics.fmean(r['same'][name] for r in group):.0%} "
                f"| {statistics.fmean(r['computed'][name] for r in group):.0f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())

"""``bench locomo``: answer quality and latency of the KV path vs the text path on LoCoMo.

Per conversation, a fresh user gets the conversation's memory facts through
``engine.memory.add``. Per question and k, the top-k facts are retrieved once and the SAME
facts answer on both paths (identical prompt token ids), so the paths differ only in how
the facts' KV is obtained. Every request is appended to the run's ``requests.jsonl`` as it
finishes; a resumed run skips the (conversation, question, k, mode) already there.

An optional ``judge`` (``judge(question, gold, answer) -> float``) adds a second score to
each record (``judge``); the command line does not offer one yet.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from inferscale_memory.bench.locomo_dataset import CATEGORIES, LocomoConversation, LocomoQuestion
from inferscale_memory.bench.run_folder import RunFolder
from inferscale_memory.bench.scoring import agreement, evidence_recall, locomo_f1
from inferscale_memory.bench.stats import mean, median, paired_difference, percentile
from inferscale_memory.engine import MemoryEngine
from inferscale_memory.fields import MODES
from inferscale_memory.results import ChatResult
from inferscale_memory.store import ScoredFact

Judge = Callable[[str, str, str], float]
KEY = ("conversation", "question_index", "k", "mode")
INSTRUCTION = "Answer with a short phrase."


def question_messages(question: LocomoQuestion) -> list[dict[str, str]]:
    """The chat messages a LoCoMo question is asked with (scripts/recompute_proxy.py asks
    the same, so that its rows and bench locomo's measure the same prompts)."""
    return [{"role": "user", "content": f"{question.question} {INSTRUCTION}"}]


def run_locomo(engine: MemoryEngine, conversations: Sequence[LocomoConversation],
               ks: Sequence[int], run: RunFolder, *, memory: str = "observations",
               max_tokens: int = 32, judge: Judge | None = None, progress: bool = True,
               concurrency: int = 1, sequential: int = 0) -> dict[str, Any]:
    """Answer every question at every k on both paths; returns (and writes) the summary.

    The first ``sequential`` questions of each conversation are answered one request at a
    time (their TTFT is the one reported); the others ``concurrency`` requests at a time
    (their TTFT is recorded but moves with the load). ``concurrency=1`` answers every
    question alone.
    """
    done = run.done(KEY)
    engine.reset_prefix_cache()  # an earlier run on this engine left these very prompts
    todo = {conv.sample_id: [(q, k, m) for q in conv.questions for k in ks for m in MODES
                             if (conv.sample_id, q.index, k, m) not in done]
            for conv in conversations}
    with tqdm(total=sum(map(len, todo.values())), desc="locomo", unit="req",
              disable=not progress) as bar:
        runner = _Runner(engine, run, bar, memory, max_tokens, judge)
        for conv in conversations:
            if todo[conv.sample_id]:
                alone = {q.index for q in conv.questions[:sequential]}
                runner.conversation(conv, todo[conv.sample_id],
                                    alone if concurrency > 1 else None, concurrency)
    summary = summarize_locomo(run.rows(), ks)
    run.write_summary(summary)
    return summary


class _Runner:
    """Answers one conversation's outstanding requests and records them."""

    def __init__(self, engine: MemoryEngine, run: RunFolder, bar: tqdm, memory: str,
                 max_tokens: int, judge: Judge | None) -> None:
        self.engine, self.run, self.bar = engine, run, bar
        self.memory, self.max_tokens, self.judge = memory, max_tokens, judge

    def conversation(self, conv: LocomoConversation,
                     todo: list[tuple[LocomoQuestion, int, str]],
                     alone: set[int] | None = None, concurrency: int = 1) -> None:
        """Add the facts for a fresh user, answer ``todo``, delete the user's facts.

        ``alone``: indices of the questions answered one request at a time before the
        others are sent ``concurrency`` at a time (``None``: every one alone).
        """
        user_id = f"locomo-{conv.sample_id}-{uuid.uuid4().hex[:8]}"
        every = conv.facts(self.memory)
        limit = self.engine.config.max_fact_tokens
        facts = [f for f in every if len(self.engine.builder.fact_ids(f.text)) <= limit]
        self.bar.set_postfix_str(f"{conv.sample_id}: adding {len(facts)} facts")
        added = self.engine.memory.add([f.text for f in facts], user_id=user_id,
                                       metadata=[{"dia_ids": list(f.dia_ids)} for f in facts])
        dia_ids = {fact.id: source.dia_ids for fact, source in zip(added, facts, strict=True)}
        context = {"conversation": conv.sample_id, "user_id": user_id, "facts": len(facts),
                   "facts_skipped": len(every) - len(facts)}
        try:
            jobs = self._jobs(todo, user_id, dia_ids, context)
            for job in jobs:
                if alone is None or job.question.index in alone:
                    self._record(job, self.engine.arun(self._answer(job)), concurrent=False)
            rest = [job for job in jobs if alone is not None and job.question.index not in alone]
            if rest:
                self.engine.arun(self._answer_all(rest, concurrency))
        finally:
            self.engine.memory.delete_all(user_id=user_id)

    def _jobs(self, todo: list[tuple[LocomoQuestion, int, str]], user_id: str,
              dia_ids: dict[str, Any], context: dict[str, Any]) -> list[_Job]:
        """Retrieve once per question (at its largest k; a top-k is a prefix of it) and
        pair each (question, k, mode) with its facts."""
        grouped = _group(todo)
        widest: dict[int, int] = {}
        for question, k in grouped:
            widest[question.index] = max(k, widest.get(question.index, 0))
        found: dict[int, tuple[list[ScoredFact], float]] = {}
        jobs = []
        for (question, k), modes in grouped.items():
            if question.index not in found:
                self.bar.set_postfix_str(f"{context['conversation']} q{question.index}")
                start = time.perf_counter()
                wide = widest[question.index]
                hits = self.engine.memory.search(question.question, user_id=user_id,
                                                 k=wide) if wide else []
                found[question.index] = (hits, (time.perf_counter() - start) * 1000)
            hits, search_ms = found[question.index]
            retrieved = hits[:k]
            sources = [list(dia_ids[s.fact.id]) for s in retrieved]
            retrieval = {"k": k, "search_ms": search_ms,
                         "recall": evidence_recall(question.evidence, sources),
                         "retrieved_dia_ids": sources}
            jobs += [_Job(question, retrieved, user_id, mode, {**context, **retrieval})
                     for mode in modes]
        return jobs

    async def _answer_all(self, jobs: list[_Job], concurrency: int) -> None:
        gate = asyncio.Semaphore(concurrency)

        async def one(job: _Job) -> None:
            async with gate:
                self._record(job, await self._answer(job), concurrent=True)

        await asyncio.gather(*(one(job) for job in jobs))

    async def _answer(self, job: _Job) -> ChatResult:
        return await self.engine.achat(question_messages(job.question), user_id=job.user_id,
                                       mode=job.mode, facts=list(job.facts),
                                       max_tokens=self.max_tokens)

    def _record(self, job: _Job, result: ChatResult, *, concurrent: bool) -> None:
        question, answer = job.question, result.text.strip()
        judged = self.judge(question.question, question.answer, answer) if self.judge else None
        m = result.metrics
        self.run.append({
            **job.context, "question_index": question.index, "category": question.category,
            "question": question.question, "gold": question.answer, "mode": job.mode,
            "answer": answer, "f1": locomo_f1(answer, question.answer, question.category),
            "judge": judged, "ttft_ms": m.ttft_ms, "latency_ms": m.latency_ms,
            "concurrent": concurrent,
            "prompt_tokens": m.prompt_tokens, "memory_tokens": m.memory_tokens,
            "injected_tokens": m.injected_tokens, "cached_tokens": m.cached_tokens,
            "computed_tokens": m.computed_tokens, "output_tokens": m.output_tokens,
            "recomputed_facts": len(m.recomputed_fact_ids), "token_ids": result.token_ids})
        self.bar.update()


@dataclass(frozen=True)
class _Job:
    """One request to make: a question on one path with its retrieved facts."""

    question: LocomoQuestion
    facts: list[ScoredFact]
    user_id: str
    mode: str
    context: dict[str, Any]


def _group(todo: list[tuple[LocomoQuestion, int, str]]
           ) -> dict[tuple[LocomoQuestion, int], list[str]]:
    """The paths still to answer per (question, k), in question order."""
    grouped: dict[tuple[LocomoQuestion, int], list[str]] = {}
    for question, k, mode in todo:
        grouped.setdefault((question, k), []).append(mode)
    return grouped


def summarize_locomo(rows: list[dict[str, Any]], ks: Sequence[int] | None = None
                     ) -> dict[str, Any]:
    """Per k: both paths' F1 (overall and per category), TTFT, latency, tokens; the
    retrieval recall; greedy agreement and the paired F1 difference (KV - text)."""
    ks = sorted({row["k"] for row in rows} if ks is None else set(ks))
    by_k = []
    for k in ks:
        pairs = _pairs([row for row in rows if row["k"] == k])
        if not pairs:
            continue
        kv, text = [p["kv"] for p in pairs], [p["text"] for p in pairs]
        agreements = [agreement(a["token_ids"], b["token_ids"]) for a, b in zip(kv, text,
                                                                               strict=True)]
        diff, half_width = paired_difference([r["f1"] for r in kv], [r["f1"] for r in text])
        by_k.append({"k": k, "questions": len(pairs),
                     "by_category": {str(c): sum(r["category"] == c for r in kv)
                                     for c in CATEGORIES},
                     "recall": mean(r["recall"] for r in kv),
                     "agreement": mean(float(same) for same, _ in agreements),
                     "agreement_prefix": mean(prefix for _, prefix in agreements),
                     "f1_diff": diff, "f1_diff_ci95": half_width,
                     "kv": _path_summary(kv), "text": _path_summary(text)})
    conversations = sorted({row["conversation"] for row in rows})
    return {"workload": "locomo", "conversations": conversations,
            "questions": len({(r["conversation"], r["question_index"]) for r in rows}),
            "by_k": by_k}


def _pairs(rows: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """Records of the same (conversation, question, k) on both paths."""
    grouped: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((row["conversation"], row["question_index"]), {})[row["mode"]] = row
    return [pair for _, pair in sorted(grouped.items()) if set(pair) == set(MODES)]


def _path_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    alone = [r for r in rows if not r.get("concurrent")]
    ttft = [r["ttft_ms"] for r in alone or rows]
    judged = [r["judge"] for r in rows if r.get("judge") is not None]
    return {"f1": mean(r["f1"] for r in rows),
            "f1_by_category": {str(c): mean(r["f1"] for r in rows if r["category"] == c)
                               for c in CATEGORIES if any(r["category"] == c for r in rows)},
            "judge": mean(judged) if judged else None,
            "ttft_median_ms": median(ttft), "ttft_p90_ms": percentile(ttft, 90),
            "ttft_requests": len(ttft), "ttft_under_load": not alone,
            "latency_median_ms": median(r["latency_ms"] for r in rows),
            "memory_tokens": mean(r["memory_tokens"] for r in rows),
            "computed_tokens": mean(r["computed_tokens"] for r in rows),
            "output_tokens": mean(r["output_tokens"] for r in rows)}

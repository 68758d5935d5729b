"""``bench synthetic`` without an engine: the report JSON is rewritten after every measured
point, so a crash keeps the points that finished."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from inferscale_memory.bench.synthetic import format_report, measure_synthetic, write_json
from inferscale_memory.runtime import Completion
from inferscale_memory.tokens import TokenRequest


class Crash(RuntimeError):
    pass


class FakeWork:
    """A workload double: TTFT = k ms on the KV path, 3k on the text path (k on a second
    question about the same facts: the prefix cache holds them); the ``crash_at``-th
    request after the capture raises (the two warm-up requests count)."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at, self.requests, self.warm = crash_at, 0, False
        self.asked: list[tuple[int, ...]] = []

    async def capture(self, count: int) -> float:
        return count / 100

    def sample(self, k: int) -> list[int]:  # new facts every trial
        self.sampled = getattr(self, "sampled", 0) + k
        return list(range(self.sampled - k, self.sampled))

    def shuffle(self, items: list[Any]) -> None:
        items.reverse()

    def prompt(self, facts: list[int]) -> TokenRequest:
        return TokenRequest(facts, None)  # type: ignore[arg-type]

    async def run(self, prompt: TokenRequest, mode: str, max_tokens: int = 1,
                  **kwargs: Any) -> Completion:
        k = len(prompt.token_ids)
        if self.warm:
            self.requests += 1
            if self.requests == self.crash_at:
                raise Crash("engine died")
        cached = mode == "text" and tuple(prompt.token_ids) in self.asked
        if mode == "text":
            self.asked.append(tuple(prompt.token_ids))
        return Completion(token_ids=[0] * max_tokens,
                          ttft_s=(k if mode == "kv" or cached else 3 * k) / 1000)


def measure(work: FakeWork, out: Path) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        def save(report: dict[str, Any]) -> None:
            work.warm = True  # the first save comes after the capture
            write_json(out, report)
        return await measure_synthetic(work, "llama-tiny", [1, 2], trials=2,  # type: ignore[arg-type]
                                       concurrency=2, output_len=4, recompute_tail=0,
                                       save=save)
    return asyncio.run(go())


def test_the_report_is_written_after_every_point(tmp_path: Path) -> None:
    out = tmp_path / "synthetic.json"
    report = measure(FakeWork(), out)
    assert json.loads(out.read_text()) == report
    assert report["complete"] is True
    assert [(r["k"], r["trials"], r["kv_median_ms"]) for r in report["ttft"]] == [
        (1, 2, 1.0), (2, 2, 2.0)]
    # the second question about the same facts: the text path finds them cached
    assert [(r["text_median_ms"], r["text_warm_median_ms"]) for r in report["ttft"]] == [
        (3.0, 1.0), (6.0, 2.0)]
    assert set(report["throughput"]) >= {"text", "kv"}
    # KV / cold text 0.33; KV / the best text (warm) 1.00
    assert "| 2 | 6.0 (6.0) | 2.0 (2.0) | 0.33 | 2.0 / 2.0 | 1.00 | - |" in format_report(
        report)


def test_a_crash_keeps_the_finished_points(tmp_path: Path) -> None:
    out = tmp_path / "synthetic.json"
    # 2 warm-up requests, then 4 (k, trial) pairs x 2 questions x 2 paths: the 12th is
    # the third pair's
    with pytest.raises(Crash):
        measure(FakeWork(crash_at=12), out)
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and kept["capture_facts_per_s"] == 100
    # the shuffled plan runs k=2 twice, then k=1: two finished trials of k = 2
    assert [(r["k"], r["trials"]) for r in kept["ttft"]] == [(2, 2)]
    assert "throughput" not in kept
    # a crash in the throughput step keeps the whole TTFT sweep and the finished path
    with pytest.raises(Crash):
        measure(FakeWork(crash_at=2 + 16 + 2 + 1), out)
    kept = json.loads(out.read_text())
    assert [(r["k"], r["trials"]) for r in kept["ttft"]] == [(1, 2), (2, 2)]
    assert set(kept["throughput"]) == {"concurrency", "k", "output_len", "text"}


def test_write_json_replaces_the_file_atomically(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "synthetic.json"
    write_json(out, {"a": 1})

    def crash(*args: Any) -> None:
        raise OSError("killed between the write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_json(out, {"a": 2})
    monkeypatch.undo()
    assert json.loads(out.read_text()) == {"a": 1}  # the old report, whole
    assert [p.name for p in tmp_path.iterdir()] == ["synthetic.json"]  # no temp file left
    write_json(out, {"a": 3})
    assert json.loads(out.read_text()) == {"a": 3}


def test_the_kv_path_injects_all_but_the_policys_tail() -> None:
    from inferscale_memory.bench.synthetic import USER, SyntheticWorkload

    work = SyntheticWorkload(None, vocab=1000, header_len=4, fact_len=3,  # type: ignore[arg-type]
                             recompute_tail=1)
    work.facts = [[11, 12, 13], [21, 22, 23], [31, 32, 33]]
    prompt = work.prompt([2, 0, 1], question=[7, 7])
    assert prompt.token_ids == work.header + [31, 32, 33, 11, 12, 13, 21, 22, 23, 7, 7]
    assert prompt.params.user == USER
    assert [(s.key.name, s.start, s.end) for s in prompt.params.inject] == [
        ("header:synthetic", 0, 4), ("2", 4, 7), ("0", 7, 10)]  # fact 1 is the tail


def test_captures_with_context_follow_held_facts_in_the_order_they_were_added() -> None:
    from inferscale_memory.bench.synthetic import SyntheticWorkload

    work = SyntheticWorkload(None, vocab=1000, header_len=4, fact_len=3)  # type: ignore[arg-type]
    first = work.capture_requests(2, context=4)  # nothing held yet: right after the header
    assert [r.token_ids for r in first] == [work.header + work.facts[0],
                                            work.header + work.facts[1]]
    work.capture_requests(4)
    for request in work.capture_requests(3, context=4):
        header, fact = request.params.capture
        index = int(fact.key.name)
        assert index >= 6 and request.token_ids[fact.start:fact.end] == work.facts[index]
        between = request.token_ids[header.end:fact.start]
        chunks = [between[i:i + 3] for i in range(0, len(between), 3)]
        context = [work.facts.index(chunk) for chunk in chunks]
        assert len(context) == 4 and context == sorted(context) and max(context) < 6


def test_the_report_compares_the_kv_path_with_both_floors() -> None:
    row = {"k": 0, "text_median_ms": 12.0, "text_p90_ms": 13.0, "kv_median_ms": 12.6,
           "kv_p90_ms": 13.0}
    report = {"shape": "llama-tiny", "capture_facts_per_s": 100.0, "recompute_tail": 4,
              "ttft": [row, {**row, "k": 50, "kv_median_ms": 18.0}],
              "throughput": {"concurrency": 2, "k": 50, "output_len": 4,
                             "text": {"requests_per_s": 1.0}, "kv": {"requests_per_s": 6.0}},
              "vllm_floor": {"median_ms": 10.0, "p90_ms": 11.0, "trials": 10}}
    text = format_report(report)
    assert "capture 100 facts/s; the KV path" in text
    assert "capture 100 facts/s right after the header, 25 after 4 context facts" in \
        format_report({**report, "capture_context": 4, "capture_context_facts_per_s": 25.0})
    assert "vLLM floor without the connector (header + question): 10.0 ms; " \
        "ours (text, k=0) 12.0 ms = 1.20x" in text
    assert "KV TTFT / our floor: k=0 1.05x, k=50 1.50x" in text


def test_a_prompt_that_injects_no_fact_is_the_text_request() -> None:
    """As the engine sends it (``FactKV.inject_params``): with no fact to inject, the KV
    path's request carries nothing for the connector, so its k = 0 is the text path's."""
    from inferscale_memory.bench.synthetic import SyntheticWorkload

    work = SyntheticWorkload(None, vocab=1000, header_len=4, fact_len=3,  # type: ignore[arg-type]
                             recompute_tail=4)
    work.facts = [[11, 12, 13], [21, 22, 23]]
    assert SyntheticWorkload.params(work.prompt([], question=[7]), "kv") is None
    assert SyntheticWorkload.params(work.prompt([0, 1], question=[7]), "kv") is None  # all tail
    work.recompute_tail = 1
    injecting = work.prompt([0, 1], question=[7])
    assert SyntheticWorkload.params(injecting, "kv") is injecting.params
    assert SyntheticWorkload.params(injecting, "text") is None

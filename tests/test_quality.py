"""The answer-quality levers without a model: prompt order and the injected span."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferscale_memory import InvalidInputError
from inferscale_memory.fact_kv import FactKV
from inferscale_memory.layout import PromptLayout, prompt_contexts, prompt_order, tail_size
from inferscale_memory.results import KVStats
from inferscale_memory.store import Fact, ScoredFact


def scored(name: str, created_at: float, score: float) -> ScoredFact:
    return ScoredFact(Fact(name, "u", f"text {name}", {}, created_at, created_at), score)


# Best first, as a search returns them: b was added last, a first.
RANKED = [scored("b", 3.0, 0.9), scored("a", 1.0, 0.8), scored("c", 2.0, 0.7)]


def test_rank_order_puts_the_best_fact_last() -> None:
    assert [f.fact.id for f in prompt_order(RANKED, "rank")] == ["c", "a", "b"]


def test_time_order_is_the_order_of_the_adds() -> None:
    assert [f.fact.id for f in prompt_order(RANKED, "time")] == ["a", "c", "b"]
    later = [scored("x", 5.0, 0.9), scored("y", 4.0, 0.1), scored("z", 6.0, 0.5)]
    assert [f.fact.id for f in prompt_order(later, "time")] == ["y", "x", "z"]
    assert [f.fact.id for f in prompt_order(later, "rank")] == ["z", "y", "x"]
    with pytest.raises(InvalidInputError):
        prompt_order(later, "alphabetical")


def inject_spans(tail: int) -> list[tuple[str, int, int]]:
    layout = PromptLayout(list(range(40)), 5, [("f1", 5, 10), ("f2", 10, 18), ("f3", 18, 30)],
                          "L")
    builder = SimpleNamespace(header_name="header:L")  # all inject_params reads of it
    fact_kv = FactKV(None, builder, KVStats())  # type: ignore[arg-type]
    params = fact_kv.inject_params(layout, "u", tail)
    assert params is not None
    return [(s.key.name, s.start, s.end) for s in params.inject]


@pytest.mark.parametrize(("tail", "named"), [
    (0, ["header:L", "f1", "f2", "f3"]), (1, ["header:L", "f1", "f2"]),
    (2, ["header:L", "f1"]), (3, ["header:L"]), (10, ["header:L"])])
def test_recompute_tail_leaves_the_last_facts_unnamed(tail: int, named: list[str]) -> None:
    spans = inject_spans(tail)
    assert [name for name, _, _ in spans] == named
    assert spans[0][1] == 0  # a contiguous run from position 0
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize(("facts", "tail", "computed"), [
    (10, 0, 0), (1, 0, 0),              # no tail: every fact injected
    (10, 4, 4), (50, 4, 4), (6, 4, 4),  # the last 4 computed, at least 2 injected
    (5, 4, 5), (4, 4, 4), (2, 4, 2),    # one fact would be left: all computed
    (3, 1, 1), (2, 1, 2), (0, 4, 0)])
def test_tail_size_computes_the_last_facts_and_no_lone_context_captured_one(
        facts: int, tail: int, computed: int) -> None:
    assert tail_size(facts, tail, captured_alone=False) == computed
    # Facts captured right after the header: a lone first fact is exact, it stays injected.
    assert tail_size(facts, tail, captured_alone=True) == min(facts, tail)


def test_prompt_contexts_are_the_facts_right_before_each_fact_in_the_prompt() -> None:
    prompt = [f.fact for f in prompt_order(RANKED, "rank")]  # c, a, b
    c, a, b = prompt
    assert prompt_contexts(prompt, [b, c], 1) == {"b": (a.text,), "c": ()}
    assert prompt_contexts(prompt, [b], 5) == {"b": (c.text, a.text)}
    assert prompt_contexts(prompt, [b], 0) == {}

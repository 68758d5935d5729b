"""scripts/recompute_proxy.py's plain model on the tests' tiny random-weight Llama: it
computes what transformers computes, and its selective recompute spans the range from the
injected KV (nothing recomputed) to the text path (every injected token recomputed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from script_module import load_script

from inferscale_memory.layout import PromptBuilder

proxy = load_script("recompute_proxy")

FACTS = ["Priya lives in Lisbon.", "Priya plays the cello.", "Priya's sister is Asha.",
         "Priya moved to Lisbon in 2021."]


@pytest.fixture(scope="module")
def plain(tiny_model: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    builder = PromptBuilder(AutoTokenizer.from_pretrained(str(tiny_model)))
    return hf, proxy.PlainModel(hf), builder


def test_the_plain_model_computes_what_transformers_computes(plain) -> None:
    proxy.check(*plain)  # logits, a fact injected where captured, rotations composing


def test_recomputing_every_injected_token_gives_the_text_path(plain) -> None:
    _, model, builder = plain
    layout = builder.build([{"role": "user", "content": "Where does Priya live?"}],
                           [(str(i), text) for i, text in enumerate(FACTS)])
    ids, spans = layout.token_ids, layout.fact_spans
    inject_end = spans[2][2]  # facts 0-2 injected, fact 3 and the question computed
    text_logits, text_kv = model.forward(ids, 0)
    parts = [([k[:layout.header_end] for k in text_kv[0]],
              [v[:layout.header_end] for v in text_kv[1]])]
    for (_, start, _end), text in zip(spans[:3], FACTS, strict=False):
        # each fact captured after the header alone, then moved to its place
        cap_ids, cap_start, cap_end = builder.capture_prompt(text)
        _, (k, v) = model.forward(cap_ids[:cap_end], 0)
        parts.append(([model.shift(x[cap_start:cap_end], start - cap_start) for x in k],
                      [x[cap_start:cap_end] for x in v]))
    injected = proxy.concat(*parts)
    positions = [p for _, s, e in spans[:3] for p in range(s, e)]

    def answer(past) -> torch.Tensor:
        return model.forward(ids[inject_end:], inject_end, past)[0]

    none = answer(model.recompute(ids[:inject_end], injected, []))
    assert torch.equal(none, answer(injected))
    drift = proxy.kl(text_logits, none)
    assert drift > 1e-4  # facts 1 and 2 never read the facts before them
    every = answer(model.recompute(ids[:inject_end], injected, positions))
    assert proxy.kl(text_logits, every) < 1e-6
    some = answer(model.recompute(ids[:inject_end], injected, positions[len(positions) // 2:]))
    assert proxy.kl(text_logits, some) < drift
    deviation = model.deviation(ids[:inject_end], injected, positions)
    first = spans[0][2] - spans[0][1]  # the first fact was captured where it sits: exact
    assert float(deviation[:first].abs().max()) < 1e-4 < float(deviation[first:].max())


def test_a_question_s_paths_span_the_injected_kv_to_the_text_path(plain, tiny_model) -> None:
    """run_question end to end: a tail of every fact, or every injected token recomputed,
    is the text path (its first answer token's distribution and its greedy answer, decoded
    in one batch with the other paths); with facts injected it drifts; the computed tokens
    add up."""
    from transformers import AutoTokenizer

    from inferscale_memory.bench.locomo import question_messages
    from inferscale_memory.bench.locomo_dataset import LocomoQuestion

    _, model, builder = plain
    question = LocomoQuestion(0, "Where does Priya live?", "Lisbon", 4, ())
    captures = proxy.Captures(model, builder, FACTS, [[1], [0], [0, 1], [0, 2]])
    variants = [proxy.Variant.parse(v)
                for v in ("t4", "t0", "t0+d100%", "t1+d5", "t1+T10", "t1+f5", "t1+r5")]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    row = proxy.run_question(model, tokenizer, builder, captures, [3, 2, 1, 0], question,
                             FACTS, 4, variants, 6, set(), proxy.random.Random(0))
    assert row["kl"]["t4"] < 1e-9 and row["same"]["t4"]
    assert row["kl"]["t0+d100%"] < 1e-6 and row["same"]["t0+d100%"]
    assert row["kl"]["t0"] > 1e-4
    assert row["f1"]["t4"] == row["f1"]["text"]
    # the prompt bench locomo asks the engine (its answer instruction included)
    layout = builder.build(question_messages(question),
                           [(str(i), FACTS[i]) for i in (0, 1, 2, 3)])
    assert row["prompt_tokens"] == len(layout.token_ids)
    spans, total = layout.fact_spans, len(layout.token_ids)
    injected = spans[-1][1] - layout.header_end  # tokens of the 3 facts before the tail
    assert row["computed"]["t4"] == total - layout.header_end
    assert row["computed"]["t0+d100%"] == total - layout.header_end
    assert row["computed"]["t1+d5"] == total - spans[-1][1] + 5
    assert row["computed"]["t1+T10"] == total - spans[-2][1]  # one fact more, >= 10 tokens
    assert injected > 10 and row["computed"]["t0"] == total - spans[-1][2]


def test_variants_name_their_tail_pick_and_budget() -> None:
    assert proxy.Variant.parse("t4+d15%").budget(200) == 30
    assert proxy.Variant.parse("t2+d64").budget(40) == 40
    assert proxy.Variant.parse("t4").budget(200) == 0
    with pytest.raises(SystemExit, match="want tN"):
        proxy.Variant.parse("t4+x5")


def test_capture_contexts_in_add_order_or_nearest_last() -> None:
    """The proxy's contexts are the engine's (``capture_context_order``): the same nearest
    facts, oldest first or least similar first."""
    import numpy as np

    vectors = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.6, 0.4]])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # fact 2's nearest: 3, then 1; fact 0's: 1, then 3
    assert proxy.nearest_contexts(vectors, 2)[2] == [1, 3]
    assert proxy.nearest_contexts(vectors, 2, "similarity")[2] == [1, 3]
    assert proxy.nearest_contexts(vectors, 2, "similarity")[0] == [3, 1]
    assert proxy.nearest_contexts(vectors, 2)[0] == [1, 3]
    found = {"contexts": [[1, 3]]}
    assert proxy.contexts_of(found, "added") == [[1, 3]]
    with pytest.raises(SystemExit, match="predates"):
        proxy.contexts_of(found, "similarity")


def test_shards_answer_every_question_once_between_them() -> None:
    class Conv:
        def __init__(self, sample_id: str, count: int) -> None:
            self.sample_id = sample_id
            self.questions = [type("Q", (), {"index": i, "category": 1 + i % 5})()
                              for i in range(count)]

    conversations = [Conv("a", 23), Conv("b", 17)]
    whole = proxy.questions_in_order(conversations, 0, proxy.random.Random(0))
    parts = [proxy.shard(proxy.questions_in_order(conversations, 0, proxy.random.Random(0)),
                         f"{i}/3") for i in range(3)]
    key = [(s, q.index) for s, q in whole]
    assert sorted(key) == sorted((s, q.index) for part in parts for s, q in part)
    assert len(key) == len(set(key)) == 19 + 14  # categories 1-4 only
    assert {s for s, _ in parts[0]} == {"a", "b"}  # each share mixes the conversations
    assert proxy.shard(whole, "0/1") == whole
    for bad in ("3/3", "1", "x/2"):
        with pytest.raises(SystemExit, match="--shard"):
            proxy.shard(whole, bad)


def test_a_run_started_again_answers_only_what_its_rows_lack(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    assert proxy.finished(out) == set()
    rows = [{"conversation": "a", "question": 3, "k": 10, "f1": {}},
            {"conversation": "b", "question": 3, "k": 20, "f1": {}}]
    out.write_text("".join(proxy.json.dumps(r) + "\n" for r in rows)
                   + '{"conversation": "a", "quest')  # the process was killed mid-line
    assert proxy.finished(out) == {("a", 3, 10), ("b", 3, 20)}
    assert [proxy.json.loads(line) for line in out.read_text().splitlines()] == rows


def test_the_summary_sets_each_path_against_the_text_path_and_the_first_path() -> None:
    def row(conversation: str, text: float, t4: float, t2: float) -> dict:
        return {"model": "m", "k": 10, "conversation": conversation, "question": 0,
                "f1": {"text": text, "t4": t4, "t2": t2}, "kl": {"t4": 0.2, "t2": 0.1},
                "same": {"t4": True, "t2": False}, "computed": {"t4": 150, "t2": 90}}

    rows = [row("a", 1.0, 0.5, 1.0), row("b", 0.0, 0.0, 0.5)]
    t4, t2 = ([c.strip() for c in line.split("|")[4:11]]
              for line in proxy.summarize(rows)[3:5])
    # variant, F1 - text (its interval from two pairs), half A, half B, F1 - first, KL, ratio
    assert t4[0] == "t4" and t4[1].startswith("-25.0 (") and t4[2:5] == ["-50.0", "+0.0", ""]
    assert t2[0] == "t2" and t2[1].startswith("+25.0 (") and t2[2:4] == ["+0.0", "+50.0"]
    assert t2[4] == "+50.0 (0.0)" and t2[6] == "0.50"  # against the first path, paired

"""scripts/recompute_proxy.py's plain model on the tests' tiny random-weight Llama: it
computes what transformers computes, and its selective recompute spans the range from the
injected KV (nothing recomputed) to the text path (every injected token recomputed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from inferscale_memory.layout import PromptBuilder

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("recompute_proxy",
                                              ROOT / "scripts" / "recompute_proxy.py")
assert spec is not None and spec.loader is not None
proxy = importlib.util.module_from_spec(spec)
sys.modules["recompute_proxy"] = proxy  # its dataclasses look their module up
spec.loader.exec_module(proxy)

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

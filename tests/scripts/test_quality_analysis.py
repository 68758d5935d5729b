"""scripts/quality_analysis.py on a ``bench locomo`` run of the engine double: halves by
conversation, evidence position and first diverging token."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))

import json  # noqa: E402

from bench_helpers import LOCOMO, FakeEngine  # noqa: E402
from script_module import load_script  # noqa: E402

from inferscale_memory.bench.commands import bench_locomo  # noqa: E402
from inferscale_memory.bench.locomo_dataset import load_locomo  # noqa: E402
from inferscale_memory.bench.run_folder import RunFolder  # noqa: E402

analysis = load_script("quality_analysis")


def test_first_divergence() -> None:
    assert analysis.first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert analysis.first_divergence([1, 2], [1, 2]) is None
    assert analysis.first_divergence([1, 2], [1, 2, 5]) == 2


def test_tables_split_by_conversation_and_evidence(tmp_path: Path) -> None:
    locomo_file = tmp_path / "locomo-tiny.json"
    locomo_file.write_text(json.dumps(LOCOMO))
    engine = FakeEngine()
    engine.config = engine.config.replace(recompute_tail=1)
    run = bench_locomo(engine, locomo_file, (1, 2), out=tmp_path / "t1",  # type: ignore[arg-type]
                       progress=False).path
    by_k = analysis.pairs(RunFolder(run).rows())
    assert sorted(by_k) == [1, 2] and len(by_k[1]) == 5
    first, second = analysis.halves(by_k[1])
    assert {kv["conversation"] for kv, _ in first} == {"conv-a"}
    assert {kv["conversation"] for kv, _ in second} == {"conv-b"}
    evidence = {(c.sample_id, q.index): set(q.evidence)
                for c in load_locomo(locomo_file) for q in c.questions}
    ranks = [analysis.evidence_rank(kv, evidence) for kv, _ in by_k[2]]
    assert 0 in ranks  # the double retrieves the evidence fact first for some questions
    lines = analysis.analyse(run, evidence)
    assert len(lines) == 2 and lines[0].startswith("| t1 | 1 | +0.0")
    # the double's KV and text answers part at their last token (the token ids 3 and 4)
    assert lines[0].rstrip(" |").endswith("| 100% | 2")

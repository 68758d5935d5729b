"""``bench locomo`` end to end on the real engine: a tiny LoCoMo-format file, 2 questions,
k = 2, both paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale_memory import MemoryEngine, UnknownUserError
from inferscale_memory.bench.commands import bench_locomo

pytestmark = pytest.mark.engine


def test_bench_locomo_end_to_end(engine: MemoryEngine, locomo_file: Path,
                                 tmp_path: Path) -> None:
    folder = bench_locomo(engine, locomo_file, (2,), limit=2, conversations=["conv-a"],
                          max_tokens=8, out=tmp_path / "run", progress=False).path
    rows = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for index in {r["question_index"] for r in rows}:
        kv, text = sorted((r for r in rows if r["question_index"] == index),
                          key=lambda r: r["mode"])
        assert (kv["mode"], text["mode"]) == ("kv", "text")
        assert kv["prompt_tokens"] == text["prompt_tokens"]
        assert kv["memory_tokens"] == text["memory_tokens"] > 0
        assert kv["retrieved_dia_ids"] == text["retrieved_dia_ids"]
        assert len(kv["retrieved_dia_ids"]) == 2
        assert kv["injected_tokens"] >= kv["memory_tokens"] and text["injected_tokens"] == 0
        assert kv["recomputed_facts"] == 0
        assert 0 <= kv["f1"] <= 1 and kv["ttft_ms"] > 0 and kv["output_tokens"] >= 1
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["by_k"][0]["questions"] == 2
    assert (folder / "report.md").exists() and (folder / "f1_vs_k.png").exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["model"]["name"] == engine.model_path.name
    # the settings that decide the text path's speed, as the started engine resolved them
    assert config["model"]["engine_settings"] == engine.runtime.engine_settings
    assert isinstance(config["model"]["engine_settings"]["max_cudagraph_size"], int)
    assert config["model"]["engine_args"] == engine.config.engine_args
    try:  # the run deletes its user's facts
        left = engine.memory.list(user_id=rows[0]["user_id"])
    except UnknownUserError:
        left = []
    assert left == []

"""``bench locomo`` on an engine double: records, summary, run folder, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import FakeEngine

from inferscale_memory.bench.commands import bench_locomo
from inferscale_memory.errors import InvalidInputError


def run(engine: FakeEngine, dataset: Path, out: Path, **kwargs: object):
    return bench_locomo(engine, dataset, progress=False, out=out, **kwargs)  # type: ignore[arg-type]


def test_run_folder_records_and_summary(fake_engine: FakeEngine, locomo_file: Path,
                                        tmp_path: Path) -> None:
    folder = run(fake_engine, locomo_file, tmp_path / "run", ks=(1, 2)).path
    assert {p.name for p in folder.iterdir()} >= {
        "config.json", "requests.jsonl", "summary.json", "report.md", "f1_vs_k.png",
        "ttft_vs_k.png"}
    rows = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 5 * 2 * 2  # 5 questions of categories 1-4, 2 k values, 2 paths
    assert len(fake_engine.calls) == 20
    assert fake_engine.resets == 1
    assert fake_engine.memory.facts == {}  # every user's facts deleted afterwards
    # The double answers with the best-ranked fact: "[12 June 2023] Ben's dog is called Rex."
    rex = [r for r in rows if r["question"] == "What is Ben's dog called?" and r["k"] == 1]
    assert {r["mode"] for r in rex} == {"kv", "text"}
    assert all(r["f1"] == pytest.approx(2 / 9) and r["recall"] == 1.0 for r in rex)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["questions"] == 5
    assert summary["conversations"] == ["conv-a", "conv-b"]
    by_k = {row["k"]: row for row in summary["by_k"]}
    assert by_k[1]["agreement"] == 0.0  # the double's paths differ in the last token
    assert by_k[1]["agreement_prefix"] == pytest.approx(2 / 3)
    assert by_k[1]["f1_diff"] == 0.0
    assert by_k[1]["kv"]["ttft_median_ms"] == 10.0 and by_k[1]["text"]["ttft_median_ms"] == 30.0
    assert set(by_k[2]["kv"]["f1_by_category"]) == {"1", "2", "3", "4"}
    config = json.loads((folder / "config.json").read_text())
    assert config["workload"] == "locomo" and config["model"]["name"] == "fake-model"
    assert config["params"]["k"] == [1, 2] and "machine" in config
    report = (folder / "report.md").read_text()
    assert "F1 per category" in report and "| 2 | 5 |" in report
    assert config["model"]["start_s"] == 12.3 and "engine start 12.3 s" in report
    assert config["model"]["engine_settings"] == {"max_cudagraph_size": 512}
    assert "- engine: `{'max_cudagraph_size': 512}`" in report


def test_resume_skips_recorded_requests(fake_engine: FakeEngine, locomo_file: Path,
                                        tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(fake_engine, locomo_file, out, ks=(1,), limit=1, conversations=["conv-a"])
    assert len(fake_engine.calls) == 2
    lines = (out / "requests.jsonl").read_text().splitlines()
    # A run killed mid-write: one full record of another question and half a line.
    kept = json.loads(lines[0])
    (out / "requests.jsonl").write_text("\n".join(lines) + "\n" + json.dumps(
        kept | {"question_index": 3, "mode": "kv"}) + "\n" + '{"conversation": "conv-a", "k"')
    fake_engine.calls.clear()
    run(fake_engine, locomo_file, out, ks=(1, 2), conversations=["conv-a"], resume=True)
    # 4 questions x 2 k x 2 paths = 16, minus 2 done at k=1, minus question 3's kv at k=1.
    assert len(fake_engine.calls) == 13
    keys = [(r["question_index"], r["k"], r["mode"]) for r in
            (json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()
             if x.endswith("}"))]
    assert len(keys) == 16 and len(set(keys)) == 16
    fake_engine.calls.clear()
    run(fake_engine, locomo_file, out, ks=(1, 2), conversations=["conv-a"], resume=True)
    assert fake_engine.calls == []  # all done: not even the facts are added
    assert fake_engine.memory.facts == {}
    config = json.loads((out / "config.json").read_text())
    assert len(config["resumes"]) == 2 and config["params"]["k"] == [1]


def test_resume_refuses_other_settings_and_reuse_needs_resume(
        fake_engine: FakeEngine, locomo_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(fake_engine, locomo_file, out, ks=(1,), limit=1)
    with pytest.raises(InvalidInputError, match="max_tokens"):
        run(fake_engine, locomo_file, out, ks=(1,), max_tokens=8, resume=True)
    with pytest.raises(InvalidInputError, match="--resume"):
        run(fake_engine, locomo_file, out, ks=(1,))
    with pytest.raises(InvalidInputError, match="--out"):
        bench_locomo(fake_engine, locomo_file, resume=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="k must be"):
        run(fake_engine, locomo_file, tmp_path / "other", ks=(-1,))


def test_resumed_report_shows_the_resumed_command_and_limit(
        fake_engine: FakeEngine, locomo_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    monkeypatch.setattr("sys.argv", ["inferscale-memory", "bench", "locomo", "--limit", "1"])
    run(fake_engine, locomo_file, out, ks=(1,), limit=1, conversations=["conv-a"])
    first = len((out / "requests.jsonl").read_text().splitlines())
    monkeypatch.setattr("sys.argv", ["inferscale-memory", "bench", "locomo", "--limit", "3",
                                     "--resume"])
    run(fake_engine, locomo_file, out, ks=(1,), limit=3, conversations=["conv-a"],
        resume=True)
    report = (out / "report.md").read_text()
    assert "- command: `inferscale-memory bench locomo --limit 3 --resume`" in report
    assert "'limit': 3" in report and "'limit': 1," not in report
    assert f"resumed a run with {first} answers" in report
    assert "`inferscale-memory bench locomo --limit 1`" in report  # the first run, noted
    config = json.loads((out / "config.json").read_text())
    assert config["resumes"][-1]["answers_before"] == first


def test_text_path_reuse_needs_the_same_prompts(fake_engine: FakeEngine, locomo_file: Path,
                                                tmp_path: Path) -> None:
    source = run(fake_engine, locomo_file, tmp_path / "text", ks=(1,), limit=1).path
    fake_engine.config = fake_engine.config.replace(recompute_tail=2)
    reused = run(fake_engine, locomo_file, tmp_path / "tail2", ks=(1,), limit=1,
                 text_from=source)  # rank order: the tail does not move a fact
    assert {r["mode"]: r.get("reused_from") for r in reused.rows()}["text"] == str(source)
    fake_engine.config = fake_engine.config.replace(fact_order="time")
    with pytest.raises(InvalidInputError, match="fact_order"):
        run(fake_engine, locomo_file, tmp_path / "time", ks=(1,), limit=1, text_from=source)


def test_the_kv_cache_dtype_is_recorded_and_fixed_for_resumes_and_reuse(
        fake_engine: FakeEngine, locomo_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(fake_engine, locomo_file, out, ks=(1,), limit=1)
    config = json.loads((out / "config.json").read_text())
    assert config["params"]["kv_cache_dtype"] == "auto"
    assert config["model"]["kv_cache_dtype"] == "auto"
    assert "KV cache auto" in (out / "report.md").read_text()
    # a run with another cache (its text path differs too) is neither resumed nor reused
    config["params"]["kv_cache_dtype"] = "fp8"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match="kv_cache_dtype"):
        run(fake_engine, locomo_file, out, ks=(1,), limit=1, resume=True)
    with pytest.raises(InvalidInputError, match="kv_cache_dtype"):
        run(fake_engine, locomo_file, tmp_path / "reuse", ks=(1,), limit=1, text_from=out)
    # runs recorded before the parameter existed had the model's dtype
    del config["params"]["kv_cache_dtype"]
    (out / "config.json").write_text(json.dumps(config))
    run(fake_engine, locomo_file, out, ks=(1,), limit=1, resume=True)
    run(fake_engine, locomo_file, tmp_path / "reuse2", ks=(1,), limit=1, text_from=out)


def test_the_command_line_kv_cache_dtype_goes_over_the_configs_engine_args(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from inferscale_memory.bench.cli import _kv_cache_override, add_bench_parser

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    monkeypatch.setenv("INFERSCALE_ENGINE_ARGS", '{"max_num_seqs": 8, "kv_cache_dtype": "auto"}')
    args = parser.parse_args(["bench", "locomo", "--dataset", "x.json",
                              "--kv-cache-dtype", "fp8"])
    assert _kv_cache_override(args) == {
        "engine_args": {"max_num_seqs": 8, "kv_cache_dtype": "fp8"}}
    assert _kv_cache_override(parser.parse_args(["bench", "locomo", "--dataset", "x"])) == {}
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "locomo", "--dataset", "x", "--kv-cache-dtype", "int4"])

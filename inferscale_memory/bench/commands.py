"""The benchmark commands on an existing engine: run, write the run folder, report.

Each returns the :class:`RunFolder` it wrote (``config.json``, ``requests.jsonl``,
``summary.json``, ``report.md``, plots). ``inferscale-memory bench ...`` starts an engine
and calls these; tests and notebooks pass their own engine.

Example:
    >>> run = bench_locomo(engine, "locomo10.json", ks=(5, 10), limit=20)  # doctest: +SKIP
    >>> print((run.path / "report.md").read_text())                        # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferscale_memory.bench.locomo import KEY as LOCOMO_KEY
from inferscale_memory.bench.locomo import run_locomo
from inferscale_memory.bench.locomo_dataset import load_locomo, select
from inferscale_memory.bench.report import write_report
from inferscale_memory.bench.run_folder import PARAM_DEFAULTS, RunFolder
from inferscale_memory.bench.synthetic import LoadLog
from inferscale_memory.bench.throughput import run_throughput
from inferscale_memory.bench.ttft import run_ttft
from inferscale_memory.config import QUALITY_FIELDS
from inferscale_memory.engine import MemoryEngine
from inferscale_memory.errors import InvalidInputError

LOCOMO_FIXED = ("memory", "max_tokens", "model", "kv_cache_dtype", *QUALITY_FIELDS)


def bench_locomo(engine: MemoryEngine, dataset: str | Path, ks: Sequence[int] = (5, 10, 20, 50),
                 *, limit: int | None = None, conversations: Sequence[str] | None = None,
                 seed: int = 0, memory: str = "observations", max_tokens: int = 32,
                 out: Path | None = None, resume: bool = False,
                 text_from: Path | None = None, progress: bool = True,
                 concurrency: int = 1, sequential: int = 0) -> RunFolder:
    """LoCoMo answer quality and latency on both paths (see :mod:`.locomo`).

    The engine's quality policy (``QUALITY_FIELDS``) and KV cache dtype (``engine_args``'
    ``kv_cache_dtype``, ``"auto"``: the model's) are recorded with the parameters.
    ``text_from``: a run folder whose text-path records are reused (same dataset,
    questions, memory, answer length, model and fact order). ``concurrency`` requests are
    in flight at once, after the first ``sequential`` questions of each conversation were
    answered alone (the TTFT the report gives).
    """
    if resume and out is None:
        raise InvalidInputError("--resume needs the run folder to resume (--out RUN_DIR)")
    _check_ks(ks, minimum=0)
    chosen = select(load_locomo(dataset), list(conversations or []), limit, seed)
    params = {"dataset": Path(dataset).name, "k": list(ks), "limit": limit,
              "conversations": [c.sample_id for c in chosen], "seed": seed,
              "memory": memory, "max_tokens": max_tokens, "model": engine.model_name,
              "kv_cache_dtype": engine.config.engine_args.get("kv_cache_dtype") or "auto",
              **{name: getattr(engine.config, name) for name in QUALITY_FIELDS}}
    run = RunFolder.create(out, "locomo", params, resume=resume, fixed=LOCOMO_FIXED)
    run.write_config(engine, **({"text_from": str(text_from)} if text_from else {}))
    if text_from is not None:
        reuse_text_rows(RunFolder(text_from), run, params)
    _check_ks([concurrency], minimum=1, name="concurrency")
    _check_ks([sequential], minimum=0, name="sequential")
    run_locomo(engine, chosen, ks, run, memory=memory, max_tokens=max_tokens,
               progress=progress, concurrency=concurrency, sequential=sequential)
    write_report(run)
    return run


def reuse_text_rows(source: RunFolder, run: RunFolder, params: dict[str, Any]) -> int:
    """Copy ``source``'s text-path records of the same prompts into ``run``."""
    before = source.config()["params"]
    same = ("dataset", "seed", "memory", "max_tokens", "model", "kv_cache_dtype")
    changed = [name for name in same
               if before.get(name, PARAM_DEFAULTS.get(name)) != params.get(name)]
    if before.get("fact_order", "rank") != params["fact_order"]:
        changed.append("fact_order")
    if changed:
        raise InvalidInputError(f"cannot reuse the text path of {source.path}: "
                                f"other {', '.join(changed)}")
    done = run.done(LOCOMO_KEY)
    copied = 0
    for row in source.rows():
        key = tuple(row[name] for name in LOCOMO_KEY)
        wanted = row["conversation"] in params["conversations"] and row["k"] in params["k"]
        if row["mode"] == "text" and wanted and key not in done:
            run.append({**row, "reused_from": str(source.path)})
            copied += 1
    return copied


def bench_ttft(engine: MemoryEngine, ks: Sequence[int] = (0, 10, 20, 40), *, trials: int = 5,
               fact_words: int = 16, seed: int = 0, warmup: int = 5, out: Path | None = None,
               progress: bool = True, loads: LoadLog | None = None) -> RunFolder:
    """TTFT of both paths over k on random facts (see :mod:`.ttft`); ``loads``: the
    connector's load log the engine was started with (``INFERSCALE_CONNECTOR_TIMING``)."""
    _check_ks(ks, minimum=0)
    params = {"k": list(ks), "trials": trials, "fact_words": fact_words, "seed": seed,
              "warmup": warmup}
    run = RunFolder.create(out, "ttft", params)
    run.write_config(engine)
    run_ttft(engine, ks, trials, fact_words, seed, run, progress, warmup, loads)
    write_report(run)
    return run


def bench_throughput(engine: MemoryEngine, concurrencies: Sequence[int] = (1, 4, 8, 16), *,
                     k: int = 10, output_len: int = 32, loop_requests: int = 3,
                     duration: float | None = None, fact_words: int = 16, seed: int = 0,
                     out: Path | None = None, progress: bool = True) -> RunFolder:
    """Requests/s, tokens/s and TTFT under concurrent load (see :mod:`.throughput`)."""
    _check_ks(concurrencies, minimum=1, name="concurrency")
    _check_ks([k], minimum=1)
    params = {"concurrency": list(concurrencies), "k": k, "output_len": output_len,
              "loop_requests": loop_requests, "duration": duration,
              "fact_words": fact_words, "seed": seed}
    run = RunFolder.create(out, "throughput", params)
    run.write_config(engine)
    run_throughput(engine, concurrencies, run, k=k, output_len=output_len,
                   loop_requests=loop_requests, duration=duration, fact_words=fact_words,
                   seed=seed, progress=progress)
    write_report(run)
    return run


def _check_ks(values: Sequence[int], minimum: int, name: str = "k") -> None:
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum
                         for v in values):
        raise InvalidInputError(f"{name} must be integers >= {minimum}, got {list(values)}")

"""Token-level workloads on the bare runtime: random token ids, any model shape.

No tokenizer and no weights are needed (``load_format="dummy"`` computes like real weights,
so timings are real), which is how GPU-sized models are measured on machines without a
model hub. The layout is the one the library uses: ``header | facts | question``, built by
the library's token-level API (:mod:`inferscale_memory.tokens`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferscale_memory import sizing
from inferscale_memory.bench.shapes import SHAPES as SHAPES
from inferscale_memory.bench.shapes import shape_config, weights_dtype, write_dummy_model
from inferscale_memory.bench.shapes import write_random_model as write_random_model
from inferscale_memory.config import MemoryConfig
from inferscale_memory.connector.params import RequestParams
from inferscale_memory.connector.worker import TIMING_ENV
from inferscale_memory.layout import tail_size
from inferscale_memory.runtime import Completion, VllmRuntime
from inferscale_memory.tokens import TokenFacts, TokenRequest

USER = "bench"
LAYOUT = "synthetic"

def dummy_runtime(folder: Path, connector: bool = True, **config: Any) -> VllmRuntime:
    """vLLM with dummy weights on ``folder``; the config is checked first, the fact pool's
    size beside vLLM's share of the device included (:func:`sizing.check_memory`)."""
    engine_args = {"load_format": "dummy", "skip_tokenizer_init": True,
                   **config.pop("engine_args", {})}
    memory_config = MemoryConfig(model=str(folder), engine_args=engine_args, **config)
    sizing.check_memory(memory_config, folder)
    return VllmRuntime(folder, memory_config, connector=connector)


class SyntheticWorkload:
    """Random header, facts and questions of fixed lengths, captured into one runtime."""

    def __init__(self, runtime: VllmRuntime, vocab: int, *, header_len: int = 32,
                 fact_len: int = 32, question_len: int = 16, seed: int = 0,
                 recompute_tail: int = 0) -> None:
        self.runtime = runtime
        self.recompute_tail = recompute_tail
        self._rng = random.Random(seed)
        self._vocab = vocab
        self.header = self._ids(header_len)
        self.tokens = TokenFacts(USER, self.header, layout=LAYOUT)
        self.fact_len, self.question_len = fact_len, question_len
        self.facts: list[list[int]] = []

    def _ids(self, n: int) -> list[int]:
        return [self._rng.randrange(10, self._vocab - 10) for _ in range(n)]

    async def capture(self, count: int, context: int = 0) -> float:
        """Capture ``count`` new random facts concurrently, each after ``context`` facts
        captured before them (:meth:`capture_requests`); returns seconds taken."""
        requests = self.capture_requests(count, context)
        start = time.perf_counter()
        await asyncio.gather(*(self.runtime.control(r.token_ids, r.params) for r in requests))
        return time.perf_counter() - start

    def capture_requests(self, count: int, context: int = 0) -> list[TokenRequest]:
        """The capture requests of ``count`` new random facts. Each has ``context`` of the
        facts held before them (random ones, in the order they were added; fewer while
        fewer are held) between the header and itself, as the library's
        ``capture_context`` places a fact's most similar facts."""
        held = len(self.facts)
        self.facts.extend(self._ids(self.fact_len) for _ in range(count))
        requests = []
        for i in range(held, held + count):
            picked = sorted(self._rng.sample(range(held), min(context, held)))
            requests.append(self.tokens.capture(str(i), self.facts[i],
                                                [self.facts[j] for j in picked]))
        return requests

    def prompt(self, fact_indices: list[int], question: list[int] | None = None
               ) -> TokenRequest:
        """The facts after the header; the KV path injects all but the tail of the
        quality policy (``tail_size``), which vLLM computes."""
        # Facts are captured right after the header here.
        injected = len(fact_indices) - tail_size(len(fact_indices), self.recompute_tail, True)
        return self.tokens.prompt([(str(i), self.facts[i]) for i in fact_indices],
                                  question if question is not None
                                  else self._ids(self.question_len), inject=injected)

    def sample(self, k: int) -> list[int]:
        return self._rng.sample(range(len(self.facts)), k)

    def shuffle(self, items: list[Any]) -> None:
        self._rng.shuffle(items)

    async def run(self, prompt: TokenRequest, mode: str, max_tokens: int = 1,
                  **kwargs: Any) -> Completion:
        return await self.runtime.complete(prompt.token_ids, max_tokens=max_tokens,
                                           params=self.params(prompt, mode), user=USER,
                                           **kwargs)

    @staticmethod
    def params(prompt: TokenRequest, mode: str) -> RequestParams | None:
        """What the request carries for the connector: on the KV path, the prompt's spans
        when it injects a fact. A prompt with none (k = 0, or a tail of every fact) is the
        text path's request, as :meth:`~inferscale_memory.fact_kv.FactKV.inject_params`
        sends it for the engine: with no memory the connector has nothing to do."""
        if mode != "kv" or len(prompt.params.inject) <= 1:  # the header's span alone
            return None
        return prompt.params


class LoadLog:
    """The connector's load-time log (:data:`~inferscale_memory.connector.worker.TIMING_ENV`),
    read incrementally: :meth:`take` returns the load steps logged since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        self._offset = 0

    def take(self) -> list[dict[str, Any]]:
        with open(self.path) as log:
            log.seek(self._offset)
            lines = log.readlines()
            self._offset = log.tell()
        return [json.loads(line) for line in lines if line.strip()]


PATHS = ("text", "kv", "text_warm", "kv_warm")


async def ttft_sweep(work: SyntheticWorkload, ks: list[int], trials: int,
                     loads: LoadLog | None = None,
                     on_point: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Median and p90 TTFT (ms) per k and path; a different fact set every trial; with
    ``loads``, the median time of the connector's load step of the KV requests.

    Each trial asks two questions about the same facts in the same order, as a user
    asking twice in a row: the first finds only the header in the prefix cache (cold:
    ``text``, ``kv``), the second finds the facts there too (warm: ``text_warm``,
    ``kv_warm``), which is the best a text prompt gets from vLLM's prefix cache.

    The (k, trial) pairs run in a shuffled order, so a drift of the machine spreads over
    every k instead of landing on the rows measured last. ``on_point`` gets the rows of
    the trials done so far after every pair (a k without a finished trial has no row).
    """
    plan = [k for k in ks for _ in range(trials)]
    work.shuffle(plan)
    times: dict[int, dict[str, list[float]]] = {k: {p: [] for p in PATHS} for k in ks}
    load_ms: dict[int, list[float]] = {k: [] for k in ks}
    for k in plan:
        facts = work.sample(k)
        for warm in ("", "_warm"):
            prompt = work.prompt(facts)  # a new question each time
            for mode in ("kv", "text"):
                times[k][mode + warm].append((await work.run(prompt, mode)).ttft_s * 1000)
                if loads is not None:
                    steps = loads.take()
                    load_ms[k] += [step["ms"] for step in steps if mode == "kv" and not warm]
        if on_point is not None:
            on_point(_ttft_rows(ks, times, load_ms))
    return _ttft_rows(ks, times, load_ms)


def _ttft_rows(ks: list[int], times: dict[int, dict[str, list[float]]],
               load_ms: dict[int, list[float]]) -> list[dict]:
    """One row per k with at least one finished trial (both questions, both paths)."""
    rows = []
    for k in ks:
        done = min(len(times[k][path]) for path in PATHS)
        if not done:
            continue
        row = {"k": k, "trials": done,
               **{f"{m}_{stat}_ms": value for m in PATHS
                  for stat, value in zip(("median", "p90"), _stats(times[k][m][:done]),
                                         strict=True)}}
        if load_ms[k]:
            row["load_median_ms"] = statistics.median(load_ms[k])
        rows.append(row)
    return rows


async def throughput(work: SyntheticWorkload, concurrency: int, k: int, output_len: int,
                     mode: str) -> dict[str, float]:
    """One-shot batch of ``concurrency`` requests; requests/s and output tokens/s."""
    prompts = [work.prompt(work.sample(k)) for _ in range(concurrency)]
    start = time.perf_counter()
    done = await asyncio.gather(*(work.run(p, mode, max_tokens=output_len,
                                           ignore_eos=True) for p in prompts))
    elapsed = time.perf_counter() - start
    return {"requests_per_s": concurrency / elapsed,
            "output_tokens_per_s": sum(len(d.token_ids) for d in done) / elapsed,
            "ttft_p50_ms": statistics.median(d.ttft_s for d in done) * 1000}


def _stats(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[round(0.9 * (len(ordered) - 1))]


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` atomically: a reader (or a crash) sees the old
    file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(value, indent=2))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


WARMUP_CAPTURES = 8


def capture_count(ks: list[int], concurrency: int) -> int:
    """Facts :func:`measure_synthetic` captures after its warm-up: enough that the sweep's
    and the throughput batch's samples rarely repeat."""
    return max(200, max(ks) * 4, concurrency * 2)


def captured_facts(ks: list[int], concurrency: int, capture_context: int) -> int:
    """Facts :func:`measure_synthetic` captures in all: the warm-up, the timed batch, and
    with ``capture_context`` as many again (timed after context facts)."""
    return WARMUP_CAPTURES + capture_count(ks, concurrency) * (2 if capture_context else 1)


async def measure_synthetic(work: SyntheticWorkload, shape: str, ks: list[int], trials: int,
                            concurrency: int, output_len: int, recompute_tail: int,
                            loads: LoadLog | None = None,
                            save: Callable[[dict[str, Any]], None] | None = None,
                            details: dict[str, Any] | None = None,
                            capture_context: int = 0) -> dict[str, Any]:
    """Capture rate, TTFT sweep and one-shot throughput on ``work``'s runtime.

    Captures are timed right after the header (``capture_facts_per_s``: the fact's own
    compute), and with ``capture_context`` > 0 once more, as many new facts each after
    that many held ones (``capture_context_facts_per_s``: the library's capture at that
    ``capture_context``).

    ``save`` gets the report after every measured point (the capture rate, each (k, trial)
    pair of the sweep, each path's throughput); ``complete`` is false until the last.
    ``details`` (the run's settings) head the report.
    """
    report: dict[str, Any] = {"shape": shape, **(details or {}), "complete": False,
                              "recompute_tail": recompute_tail, "ttft": []}

    def point(**values: Any) -> None:
        report.update(values)
        if save is not None:
            save(report)

    await work.capture(WARMUP_CAPTURES)
    count = capture_count(ks, concurrency)
    point(capture_facts_per_s=count / await work.capture(count))
    if capture_context:
        point(capture_context=capture_context, capture_context_facts_per_s=count / await
              work.capture(count, context=capture_context))
    for mode in ("kv", "text"):  # warm-up of both paths
        await work.run(work.prompt(work.sample(max(ks))), mode)
    if loads is not None:
        loads.take()
    await ttft_sweep(work, ks, trials, loads, on_point=lambda rows: point(ttft=rows))
    k = min(50, max(ks))
    rates: dict[str, Any] = {"concurrency": concurrency, "k": k, "output_len": output_len}
    for mode in ("text", "kv"):
        rates[mode] = await throughput(work, concurrency, k, output_len, mode)
        point(throughput=rates)
    point(complete=True)
    return report


def run_synthetic(shape: str, ks: list[int], trials: int, concurrency: int, output_len: int,
                  workdir: Path, connector_timing: bool = False,
                  recompute_tail: int | None = None, capture_context: int | None = None,
                  out: Path | None = None,
                  vllm_floor: bool = True, kv_cache_dtype: str | None = None,
                  save: Callable[[dict[str, Any]], None] | None = None,
                  **config: Any) -> dict[str, Any]:
    """The whole synthetic report: capture rate, TTFT sweep, one-shot throughput, and
    (``vllm_floor``) the like-for-like vLLM floor, with the run's environment.

    ``connector_timing`` logs the connector's load steps (synchronising the device after
    each, which costs a little TTFT) and reports their median time per k. The KV path
    computes the tail of ``recompute_tail`` and captures are timed once more after
    ``capture_context`` held facts (both by default the config's, i.e. the default quality
    policy; see :func:`measure_synthetic`). ``out``: the report's JSON file, rewritten after
    every measured point (see :func:`measure_synthetic`), so a crash keeps what finished.
    ``vllm_floor`` then starts vLLM again with the same arguments and no connector and
    times header + question alone (:func:`measure_floor`). ``save``: instead of ``out``,
    a function that keeps the report.

    ``kv_cache_dtype`` (vLLM's engine argument; default ``engine_args``' or ``"auto"``) is
    recorded with the pool's facts per GiB (:func:`pool_details`); without ``kv_pool_gb``
    in ``config`` the pool gets room for every fact the run captures
    (:func:`workload_pool_gb`).
    """
    defaults = MemoryConfig.load()
    tail = defaults.recompute_tail if recompute_tail is None else recompute_tail
    context = defaults.capture_context if capture_context is None else capture_context
    engine_args = dict(config.pop("engine_args", {}))
    kv_cache_dtype = kv_cache_dtype or engine_args.get("kv_cache_dtype") or "auto"
    config["engine_args"] = {**engine_args, "kv_cache_dtype": kv_cache_dtype}
    details = pool_details(shape, kv_cache_dtype, config.get("tensor_parallel_size", 1))
    config.setdefault("kv_pool_gb", workload_pool_gb(
        details["pool"]["kv_bytes_per_token"], captured_facts(ks, concurrency, context)))
    details["pool"]["kv_pool_gb"] = config["kv_pool_gb"]
    loads = None
    if connector_timing:  # the engine's processes inherit the variable
        loads = LoadLog(workdir / "connector-timing.jsonl")
        os.environ[TIMING_ENV] = str(loads.path)
    folder = write_dummy_model(workdir / shape, shape)
    vocab = int(SHAPES[shape]["vocab_size"])
    if save is None and out is not None:
        save = functools.partial(write_json, out)
    runtime = None
    try:
        runtime = dummy_runtime(folder, **config)
        work = SyntheticWorkload(runtime, vocab, recompute_tail=tail)
        report = runtime.run(measure_synthetic(work, shape, ks, trials, concurrency,
                                               output_len, tail, loads, save, details,
                                               context))
        report["environment"] = run_environment(runtime)
    finally:
        if runtime is not None:
            runtime.close()
        os.environ.pop(TIMING_ENV, None)
    if save is not None:
        save(report)
    if vllm_floor:
        plain = dummy_runtime(folder, connector=False, **config)
        try:
            report["vllm_floor"] = plain.run(measure_floor(
                SyntheticWorkload(plain, vocab), trials=max(3 * trials, 30)))
            report["vllm_floor"]["engine_settings"] = plain.engine_settings
        finally:
            plain.close()
        if save is not None:
            save(report)
    return report


def pool_details(shape: str, kv_cache_dtype: str, tensor_parallel_size: int = 1
                 ) -> dict[str, Any]:
    """The run's weights and KV cache dtypes, and what one GPU's fact pool holds of
    ``shape``'s 32-token facts (computed from the shape, not measured)."""
    cfg = shape_config(shape)
    token_bytes = sizing.ModelShape.from_hf_config(cfg).kv_bytes_per_token(
        kv_cache_dtype, tensor_parallel_size)
    return {"weights": weights_dtype(cfg), "kv_cache_dtype": kv_cache_dtype,
            "pool": {"kv_bytes_per_token": token_bytes, "fact_tokens": sizing.FACT_TOKENS,
                     "facts_per_gib": sizing.facts_per_gib(token_bytes)}}


def workload_pool_gb(token_bytes: int, facts: int, fact_len: int = sizing.FACT_TOKENS,
                     header_len: int = 32) -> float:
    """A pool budget (GiB, in halves, at least 1) that holds ``facts`` facts and the header
    with a quarter to spare, so that no fact of the run is evicted."""
    need = (facts * fact_len + header_len) * token_bytes * 1.25
    return max(1.0, math.ceil(2 * need / sizing.GIB) / 2)


async def measure_floor(work: SyntheticWorkload, trials: int) -> dict[str, Any]:
    """TTFT of header + question alone on the text path (baseline (a) of the design's
    "Measuring": on an engine without the connector, vLLM's own floor)."""
    for _ in range(2):  # warm-up
        await work.run(work.prompt([]), "text")
    times = [(await work.run(work.prompt([]), "text")).ttft_s * 1000 for _ in range(trials)]
    median, p90 = _stats(times)
    return {"trials": trials, "median_ms": median, "p90_ms": p90}


def run_environment(runtime: VllmRuntime) -> dict[str, Any]:
    """What a run's numbers depend on beyond the code: versions, devices, the commit and
    the engine's resolved settings (hosts move the floor by several ms)."""
    import platform
    import subprocess

    import torch

    from inferscale_memory.driver.frontend import vllm_version

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or None
    return {
        "vllm": vllm_version(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu": _cpu_model() or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "commit": commit,
        "engine_args": runtime.config.engine_args,
        "engine_settings": runtime.engine_settings,
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def format_report(report: dict[str, Any]) -> str:
    """The report as Markdown: TTFT per k (cold and warm), throughput, and the floors."""
    context = ""
    if "capture_context_facts_per_s" in report:
        context = (f" right after the header, {report['capture_context_facts_per_s']:.0f} "
                   f"after {report['capture_context']} context facts")
    lines = [f"shape {report['shape']}: capture {report['capture_facts_per_s']:.0f} facts/s"
             f"{context}; the KV path computes a tail of {report.get('recompute_tail', 0)} facts",
             *_pool_lines(report),
             "| k | text TTFT median (p90) ms | KV TTFT median (p90) ms | KV / text "
             "| warm: text / KV ms | KV / best text | connector load ms |",
             "|---|---|---|---|---|---|---|"]
    for r in report["ttft"]:
        load = f"{r['load_median_ms']:.2f}" if "load_median_ms" in r else "-"
        warm = best = "-"
        if "text_warm_median_ms" in r:
            warm = f"{r['text_warm_median_ms']:.1f} / {r['kv_warm_median_ms']:.1f}"
            best = f"{r['kv_median_ms'] / min(r['text_median_ms'], r['text_warm_median_ms']):.2f}"
        lines.append(f"| {r['k']} | {r['text_median_ms']:.1f} ({r['text_p90_ms']:.1f}) | "
                     f"{r['kv_median_ms']:.1f} ({r['kv_p90_ms']:.1f}) | "
                     f"{r['kv_median_ms'] / r['text_median_ms']:.2f} | {warm} | {best} | "
                     f"{load} |")
    t = report["throughput"]
    lines.append(f"throughput, {t['concurrency']} requests at once, k={t['k']}, "
                 f"{t['output_len']} output tokens: text {t['text']['requests_per_s']:.1f} "
                 f"req/s, kv {t['kv']['requests_per_s']:.1f} req/s")
    lines += _floor_lines(report)
    return "\n".join(lines)


def _pool_lines(report: dict[str, Any]) -> list[str]:
    pool = report.get("pool")
    if pool is None:
        return []
    return [f"weights {report['weights']}, KV cache {report['kv_cache_dtype']}: "
            f"{pool['kv_bytes_per_token'] / 1024:g} KiB per token, {pool['facts_per_gib']:,} "
            f"facts of {pool['fact_tokens']} tokens per GiB of pool (computed); "
            f"kv_pool_gb {pool.get('kv_pool_gb', '-')}"]


def _floor_lines(report: dict[str, Any]) -> list[str]:
    """Our floor (the text path at k=0) against vLLM's without the connector, and the KV
    path against our floor."""
    floor = report.get("vllm_floor")
    ours = next((r for r in report["ttft"] if r["k"] == 0), None)
    if ours is None:
        return []
    lines = []
    if floor is not None:
        lines.append(f"vLLM floor without the connector (header + question): "
                     f"{floor['median_ms']:.1f} ms; ours (text, k=0) {ours['text_median_ms']:.1f}"
                     f" ms = {ours['text_median_ms'] / floor['median_ms']:.2f}x")
    lines.append("KV TTFT / our floor: " + ", ".join(
        f"k={r['k']} {r['kv_median_ms'] / ours['text_median_ms']:.2f}x"
        for r in report["ttft"]))
    return lines

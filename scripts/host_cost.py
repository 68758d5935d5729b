"""Host (CPU) cost of one injected request, per stage, at k = 10 / 50 / 100 facts.

A micro-benchmark run by hand, never a test: it drives each stage of an injected
request's path with the real objects, without an engine, and prints the median
microseconds of each stage. The scheduler stages call the connector class vLLM instantiates
with vLLM's own records (``Request``, ``KVCacheBlocks``, ``SchedulerOutput``), so they
include the driver's reading of them (``driver/scheduling.py``). The shape is ``bench
synthetic``'s: a 32-token header, 32-token facts, a 16-token question, every fact injected
(recompute tail 0).

Stages, in the order a request meets them:

- ``front.prompt``: :meth:`TokenFacts.prompt` lays out the token ids and spans.
- ``front.to_dict``: :meth:`RequestParams.to_dict`, the ``kv_transfer_params``.
- ``front.sampling``: the request's ``SamplingParams`` (vLLM checks every item of
  ``extra_args``).
- ``front.clone``: vLLM's ``AsyncLLM`` deep-copies the request's ``SamplingParams``
  (``extra_args`` included) once.
- ``wire``: vLLM's msgpack encoding of the ``EngineCoreRequest`` to the engine core and
  its decoding there (the ``text`` column: the same request without our params).
- ``sched.match``: the connector's first ``get_num_new_matched_tokens`` (the request's
  view, parse, salt, digests, registry lookups); ``sched.again``: a second ask while it
  waits.
- ``sched.alloc``: ``update_state_after_alloc``; ``sched.plan``: ``build_connector_meta``.
- ``plan.pickle``: the step plan pickled and unpickled (only with more than one worker
  process: one GPU runs its worker inside the engine core).
- ``worker.load``: the worker's host side of the load step (``_load_batch``): pool
  lookups and the index arrays, not the device copy.
- ``sched.finish``: ``request_finished`` and its report.
- ``warm.*``: the same facts asked again while vLLM's prefix cache holds the whole span
  (the match claims nothing; the request still carries and checks every span).

``ours, cold (sum)`` adds up the project's own stages of a cold request (``front.prompt``,
``front.to_dict``, ``sched.*``, ``worker.load``); ``front.sampling``, ``front.clone`` and
``wire`` are vLLM's work, which grows with what our params hold.

Run: ``.venv/bin/python scripts/host_cost.py [--trials N] [--k 10,50,100]``. Numbers
from a shared machine are rough: compare runs made back to back (the before/after pairs
in ``docs/benchmarks/fastpath-h200.md`` alternate two checkouts, three runs each).
"""

from __future__ import annotations

import argparse
import copy
import gc
import pickle
import random
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from inferscale_memory.connector import kv_transfer_config
from inferscale_memory.connector.connector import InferScaleConnector, InferScaleMetadata
from inferscale_memory.connector.params import FactKey, RequestParams, Span, cache_salt
from inferscale_memory.connector.worker import WorkerSide
from inferscale_memory.kv.pool import PoolEntry
from inferscale_memory.kv.slab import KVSlab
from inferscale_memory.kv.tiers import FactTiers
from inferscale_memory.tokens import TokenFacts

USER, LAYOUT = "alice", "tokens"
HEADER, FACT, QUESTION, VOCAB = 32, 32, 16, 128_000
HELD = 600  # facts the registry and the pool hold (one user, as on the H200)
BLOCK = 16


class Bench:
    """The connector's scheduler side and one worker pool holding ``HELD`` facts of
    ``USER``."""

    def __init__(self, seed: int = 0) -> None:
        from vllm.config import VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        rng = random.Random(seed)
        self.rng = rng
        self.tokens = TokenFacts(USER, [rng.randrange(VOCAB) for _ in range(HEADER)],
                                 layout=LAYOUT)
        self.facts = [[rng.randrange(VOCAB) for _ in range(FACT)] for _ in range(HELD)]
        self.connector = InferScaleConnector(VllmConfig(kv_transfer_config=kv_transfer_config()),
                                             KVConnectorRole.SCHEDULER, None)
        self.worker = WorkerSide(SimpleNamespace(cache_config=SimpleNamespace(
            block_size=BLOCK)))
        # The load batch reads the device tier's pool only; its slab is never touched here.
        self.worker.tiers = FactTiers(KVSlab(1, 1, 1, torch.uint8, "cpu", capacity=1))
        self.salt = cache_salt(USER, LAYOUT)
        self.count = 0
        self._hold()

    def _hold(self) -> None:
        """The header and every fact captured by one request, as the scheduler side
        registers them, and their rows in the worker's pool (the facts' KV as if each was
        captured right after the header)."""
        prompt = list(self.tokens.header_ids)
        spans = [Span(FactKey("", f"header:{LAYOUT}"), 0, HEADER)]
        for i, ids in enumerate(self.facts):
            spans.append(Span(FactKey(USER, str(i)), len(prompt), len(prompt) + len(ids)))
            prompt += ids
        for span in spans:
            rows = np.arange(span.start, span.end, dtype=np.int64)
            self.worker.tiers.pool.put(span.key, PoolEntry(rows, min(span.start, HEADER), 0))
        raw = RequestParams(USER, LAYOUT, capture=tuple(spans)).to_dict()
        capture = self.request(prompt + [1], raw)
        engine_core_step(self.connector, capture, 0, blocks_for(capture), None)
        report = self.connector.request_finished(capture, [])[1]
        assert len(report["inferscale"]["captured"]) == len(spans), report

    def sample(self, k: int) -> list[tuple[str, list[int]]]:
        return [(str(i), self.facts[i]) for i in self.rng.sample(range(HELD), k)]

    def request(self, token_ids: list[int], raw: dict[str, Any] | None) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        self.count += 1
        extra = {"kv_transfer_params": raw} if raw is not None else None
        return Request(f"r{self.count}", token_ids,
                       SamplingParams(max_tokens=1, extra_args=extra), None,
                       cache_salt=self.salt)


def timed(times: dict[str, list[float]], stage: str, fn: Callable[..., Any], *args: Any) -> Any:
    start = time.perf_counter_ns()
    out = fn(*args)
    times.setdefault(stage, []).append((time.perf_counter_ns() - start) / 1000)
    return out


def front(bench: Bench, k: int, times: dict[str, list[float]]) -> tuple[Any, dict[str, Any]]:
    """The front end's stages and the trip to the engine core; the request and its
    ``kv_transfer_params``."""
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    facts = bench.sample(k)
    question = [bench.rng.randrange(VOCAB) for _ in range(QUESTION)]
    prompt = timed(times, "front.prompt", bench.tokens.prompt, facts, question)
    raw = timed(times, "front.to_dict", prompt.params.to_dict)
    sampling = timed(times, "front.sampling", lambda: SamplingParams(
        max_tokens=1, extra_args={"kv_transfer_params": raw}))
    sampling = timed(times, "front.clone", copy.deepcopy, sampling)
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreRequest)
    for stage, params in (("wire", sampling), ("wire.text", SamplingParams(max_tokens=1))):
        core = EngineCoreRequest("r", prompt.token_ids, None, params, None, 0.0, None,
                                 bench.salt, None)
        timed(times, stage, lambda core: decoder.decode(encoder.encode(core)), core)
    return prompt, raw


def blocks_for(req: Any) -> list[int]:
    return list(range(req.num_prompt_tokens // BLOCK + 1))


def engine_core_step(connector: InferScaleConnector, req: Any, hit: int, blocks: list[int],
                     times: dict[str, list[float]] | None, phase: str = "sched") -> Any:
    """vLLM's scheduler admitting ``req`` after a prefix-cache hit of ``hit`` tokens, in
    ``blocks``, and prefilling the rest of it in one step: the connector's scheduler hooks
    (timed into ``times`` unless it is ``None``); returns the step's metadata."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    def stage(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if times is None else timed(times, f"{phase}.{name}", fn, *args)

    claimed, _ = stage("match", connector.get_num_new_matched_tokens, req, hit)
    stage("again", connector.get_num_new_matched_tokens, req, hit)
    allocated = KVCacheBlocks(blocks=([KVCacheBlock(i) for i in blocks],))
    stage("alloc", connector.update_state_after_alloc, req, allocated, claimed)
    req.num_computed_tokens = hit + claimed
    output = SchedulerOutput.make_empty()
    output.scheduled_new_reqs = [NewRequestData.from_request(req, (blocks,))]
    output.num_scheduled_tokens = {req.request_id: req.num_prompt_tokens - hit - claimed}
    return stage("plan", connector.build_connector_meta, output)


def engine_core(bench: Bench, prompt: Any, raw: dict[str, Any], phase: str, hit: int,
                times: dict[str, list[float]]) -> None:
    """The scheduler side's stages (and the worker's load) for one request admitted after
    a prefix-cache hit of ``hit`` tokens."""
    req = bench.request(prompt.token_ids, raw)
    blocks = blocks_for(req)
    meta = engine_core_step(bench.connector, req, hit, blocks, times, phase)
    if phase == "sched":
        assert isinstance(meta, InferScaleMetadata)
        timed(times, "plan.pickle", lambda: pickle.loads(pickle.dumps(meta, protocol=5)))
        timed(times, "worker.load", bench.worker._load_batch, meta.plan.loads)
    timed(times, f"{phase}.finish", bench.connector.request_finished, req, blocks)


def one_request(bench: Bench, k: int, times: dict[str, list[float]]) -> None:
    """Every stage of one cold request, then the warm second ask of the same facts."""
    prompt, raw = front(bench, k, times)
    engine_core(bench, prompt, raw, "sched", 0, times)
    engine_core(bench, prompt, raw, "warm", prompt.injected_tokens // BLOCK * BLOCK, times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--k", default="10,50,100")
    args = parser.parse_args()
    bench = Bench()
    ks = [int(k) for k in args.k.split(",")]
    results: dict[int, dict[str, float]] = {}
    for k in ks:
        for _ in range(20):  # warm-up
            one_request(bench, k, {})
        times: dict[str, list[float]] = {}
        gc.collect()
        gc.freeze()  # as vLLM's engine core does once it has started
        for _ in range(args.trials):
            one_request(bench, k, times)
        gc.unfreeze()
        results[k] = {stage: statistics.median(values) for stage, values in times.items()}
    stages = list(results[ks[0]])
    print("median us per request" + "".join(f"{f'k={k}':>10}" for k in ks)
          + f"{'us/fact':>10}")
    for stage in stages:
        row = [results[k][stage] for k in ks]
        per_fact = (row[-1] - row[0]) / (ks[-1] - ks[0]) if len(ks) > 1 else float("nan")
        print(f"{stage:<22}" + "".join(f"{v:>10.1f}" for v in row) + f"{per_fact:>10.2f}")
    ours = [s for s in stages if s.split(".")[0] in ("front", "sched", "worker")
            and s not in ("front.sampling", "front.clone")]
    totals = [sum(results[k][s] for s in ours) for k in ks]
    print(f"{'ours, cold (sum)':<22}" + "".join(f"{v:>10.1f}" for v in totals))
    warm = [sum(results[k][s] for s in stages if s.startswith("warm.")) for k in ks]
    print(f"{'ours, warm (sched)':<22}" + "".join(f"{v:>10.1f}" for v in warm))


if __name__ == "__main__":
    main()

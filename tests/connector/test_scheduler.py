"""Scheduler side of the connector, driven like vLLM's scheduler drives it.

The scheduler side reads plain views (``connector/step.py``): a ``RequestView`` carries a
request's prompt, ``kv_transfer_params`` and ``cache_salt``; ``ScheduledRequest``s describe
each step. The call order mirrors vLLM's scheduler: ``num_matched_tokens`` with the
(block-aligned) local prefix hit, ``after_alloc`` with the claimed count, then
``build_plan`` for the step, and ``finished`` at the end. The tests at the end drive the
connector class vLLM instantiates with vLLM's own ``Request`` and ``SchedulerOutput``
(``tests/driver/test_scheduling.py`` checks their translation on its own).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_memory.connector.params import (
    PARAMS_KEY,
    FactKey,
    RequestParams,
    Span,
    cache_salt,
    token_digest,
)
from inferscale_memory.connector.plan import DEMOTE, EVICT, PROMOTE, CaptureOp, LoadOp, StepPlan
from inferscale_memory.connector.registry import Registered
from inferscale_memory.connector.report import ConnectorReport
from inferscale_memory.connector.scheduler import SchedulerSide
from inferscale_memory.connector.step import RequestView, ScheduledRequest

LAYOUT = "L1"
HEADER = FactKey("", "header:L1")
A = FactKey("alice", "fa")
B = FactKey("alice", "fb")
C = FactKey("alice", "fc")

HEADER_IDS = list(range(100, 108))  # positions 0..8
A_IDS = list(range(200, 212))  # 12 tokens
B_IDS = list(range(300, 310))  # 10 tokens
C_IDS = list(range(400, 405))  # 5 tokens
QUESTION = list(range(500, 510))


def request(req_id: str, prompt: list[int], params: RequestParams | dict[str, Any] | None,
            salt: str | None = None) -> RequestView:
    raw = params.to_dict() if isinstance(params, RequestParams) else params
    return RequestView(req_id, list(prompt), raw, salt)


def layout(*parts: tuple[FactKey, list[int]]) -> tuple[list[int], list[Span]]:
    """Concatenate (key, tokens) parts; return the prompt and their spans."""
    prompt: list[int] = []
    spans = []
    for key, ids in parts:
        spans.append(Span(key, len(prompt), len(prompt) + len(ids)))
        prompt.extend(ids)
    return prompt, spans


def schedule(side: SchedulerSide, req: RequestView, block_ids: list[int], local_hit: int = 0,
             chunk: int | None = None) -> tuple[int, StepPlan]:
    """One scheduler step that admits ``req`` (a new request); returns (claimed, plan)."""
    claimed = side.num_matched_tokens(req, local_hit)
    side.after_alloc(req, block_ids, claimed)
    computed = local_hit + claimed
    remaining = len(req.prompt_token_ids) - computed
    scheduled = remaining if chunk is None else min(chunk, remaining)
    plan = side.build_plan([ScheduledRequest(req.request_id, computed, scheduled, None, False)])
    return claimed, plan


def continue_step(side: SchedulerSide, req: RequestView, computed: int, scheduled: int,
                  new_blocks: list[int] | None = None, resumed: bool = False) -> StepPlan:
    """A later step of a running (or resumed) request that had ``computed`` tokens."""
    return side.build_plan([ScheduledRequest(req.request_id, computed, scheduled, new_blocks,
                                             resumed)])


def salt(user: str = "alice", layout_id: str = LAYOUT) -> str:
    return cache_salt(user, layout_id)


def capture_all(side: SchedulerSide, req_id: str = "cap",
                parts: tuple[tuple[FactKey, list[int]], ...] = ((HEADER, HEADER_IDS),
                                                                (A, A_IDS), (B, B_IDS)),
                user: str = "alice") -> ConnectorReport | None:
    """Schedule a capture request of ``parts`` (+ a question) and finish it."""
    prompt, spans = layout(*parts, (FactKey(user, "q"), QUESTION))
    req = request(req_id, prompt, RequestParams(user, LAYOUT, capture=tuple(spans[:-1])))
    schedule(side, req, [1, 2, 3])
    return side.finished(req)


@pytest.fixture
def side() -> SchedulerSide:
    return SchedulerSide()


@pytest.fixture
def primed() -> SchedulerSide:
    """A scheduler that has registered HEADER, A and B."""
    side = SchedulerSide()
    report = capture_all(side)
    assert report is not None
    assert sorted(report.captured) == sorted([HEADER, A, B])
    return side


def inject_request(req_id: str, parts: tuple[tuple[FactKey, list[int]], ...],
                   tail: list[int] = QUESTION, user: str = "alice",
                   request_salt: str | None = None,
                   inject_keys: tuple[FactKey, ...] | None = None) -> RequestView:
    prompt, spans = layout(*parts)
    prompt += tail
    if inject_keys is not None:
        spans = [s for s in spans if s.key in inject_keys]
    params = RequestParams(user, LAYOUT, inject=tuple(spans))
    return request(req_id, prompt, params,
                   salt(user) if request_salt is None else request_salt)


# -- nothing exists yet ---------------------------------------------------------------


def test_nothing_is_claimed_for_unknown_facts(side: SchedulerSide) -> None:
    req = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS)))
    claimed, plan = schedule(side, req, [5, 6])
    assert claimed == 0
    assert plan.is_empty()
    report = side.finished(req)
    assert report == ConnectorReport(missing=(HEADER, A))


def test_plain_requests_are_never_claimed(side: SchedulerSide) -> None:
    capture_all(side)
    prompt, _ = layout((HEADER, HEADER_IDS), (A, A_IDS))
    for raw in (None, {"other_connector": 1}):
        req = request("plain", prompt + QUESTION, raw, salt())
        claimed, plan = schedule(side, req, [5, 6])
        assert claimed == 0 and plan.is_empty()
        side.finished(req)


# -- capture, then inject -------------------------------------------------------------


def test_capture_emits_spans_with_the_request_blocks(side: SchedulerSide) -> None:
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS), (C, QUESTION))
    req = request("cap", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:3])))
    claimed, plan = schedule(side, req, [7, 3, 9])
    assert claimed == 0
    assert plan.loads == [] and plan.evicts == []
    assert plan.captures == [CaptureOp("cap", [7, 3, 9], spans[:3])]
    assert side.facts.device == {}  # registered only when the request finishes
    report = side.finished(req)
    assert report == ConnectorReport(captured=(HEADER, A, B))
    assert set(side.facts.device) == {HEADER, A, B}
    assert side.facts.device[A].length == len(A_IDS)


def test_inject_claims_header_and_facts_with_right_pieces(primed: SchedulerSide) -> None:
    req = inject_request("inj", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 8 + 12 + 10
    assert plan.captures == [] and plan.evicts == []
    assert plan.loads == [LoadOp("inj", [4, 8], [(HEADER, 0, 8, 0), (A, 0, 12, 8),
                                                  (B, 0, 10, 20)])]
    report = primed.finished(req)
    assert report == ConnectorReport(injected_tokens=30)
    # the plan of the next step no longer carries the load
    assert primed.build_plan([]).is_empty()


def test_facts_are_claimed_at_new_positions_and_subsets(primed: SchedulerSide) -> None:
    # B before A (other positions than at capture), no A at all in a second request
    req = inject_request("swap", ((HEADER, HEADER_IDS), (B, B_IDS), (A, A_IDS)))
    claimed, plan = schedule(primed, req, [1, 2])
    assert claimed == 30
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0), (B, 0, 10, 8), (A, 0, 12, 18)]
    req2 = inject_request("only-b", ((HEADER, HEADER_IDS), (B, B_IDS)))
    claimed2, plan2 = schedule(primed, req2, [3])
    assert claimed2 == 18
    assert plan2.loads[0].pieces == [(HEADER, 0, 8, 0), (B, 0, 10, 8)]


def test_last_prompt_token_is_never_claimed(primed: SchedulerSide) -> None:
    req = inject_request("no-q", ((HEADER, HEADER_IDS), (A, A_IDS)), tail=[])
    assert len(req.prompt_token_ids) == 20
    claimed, plan = schedule(primed, req, [2, 3])
    assert claimed == 19
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0), (A, 0, 11, 8)]
    assert primed.finished(req).injected_tokens == 19


def test_claim_after_a_prefix_cache_hit_loads_only_the_rest(primed: SchedulerSide) -> None:
    req = inject_request("hit", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    # vLLM hands the connector a block-aligned local hit (16 tokens of 16-token blocks)
    claimed, plan = schedule(primed, req, [4, 8], local_hit=16)
    assert claimed == 30 - 16
    assert plan.loads == [LoadOp("hit", [4, 8], [(A, 8, 4, 16), (B, 0, 10, 20)])]


@pytest.mark.parametrize("local_hit", [30, 32, 40])
def test_nothing_to_claim_when_the_local_hit_covers_the_facts(primed: SchedulerSide,
                                                              local_hit: int) -> None:
    req = inject_request(f"hit{local_hit}", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    assert primed.num_matched_tokens(req, local_hit) == 0
    primed.after_alloc(req, [4, 8, 9], 0)
    assert primed.build_plan([]).loads == []


def test_forged_span_is_not_claimed_and_is_reported_missing(primed: SchedulerSide) -> None:
    forged_a = [t + 1 for t in A_IDS]  # same key, same length, other tokens
    req = inject_request("forged", ((HEADER, HEADER_IDS), (A, forged_a), (B, B_IDS)))
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 8
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0)]
    report = primed.finished(req)
    assert report.injected_tokens == 8
    assert report.missing == (FactKey("alice", "fa"), FactKey("alice", "fb"))


def test_span_of_another_length_is_not_claimed(primed: SchedulerSide) -> None:
    req = inject_request("short", ((HEADER, HEADER_IDS), (A, A_IDS[:-1])))
    claimed, _ = schedule(primed, req, [4, 8])
    assert claimed == 8


def test_span_not_right_after_the_previous_one_stops_the_claim(primed: SchedulerSide) -> None:
    # a gap between the header and A: vLLM can only skip a contiguous run from 0
    prompt = HEADER_IDS + [7] + A_IDS + QUESTION
    params = RequestParams("alice", LAYOUT, inject=(Span(HEADER, 0, 8), Span(A, 9, 21)))
    req = request("gap", prompt, params, salt())
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 8
    assert primed.finished(req).missing == (FactKey("alice", "fa"),)


def test_missing_fact_in_the_middle_stops_the_claim(side: SchedulerSide) -> None:
    capture_all(side, parts=((HEADER, HEADER_IDS), (A, A_IDS), (C, C_IDS)))
    assert B not in side.facts.device
    req = inject_request("mid", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS), (C, C_IDS)))
    claimed, plan = schedule(side, req, [4, 8])
    assert claimed == 20  # header + A; B is missing, so C (registered) is not loaded
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0), (A, 0, 12, 8)]
    assert side.finished(req).missing == (FactKey("alice", "fb"), FactKey("alice", "fc"))


def test_other_users_key_is_ignored_and_reported(primed: SchedulerSide) -> None:
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS))
    raw = RequestParams("alice", LAYOUT, inject=tuple(spans)).to_dict()
    raw[PARAMS_KEY]["user"] = "bob"  # bob names alice's fact
    req = request("bob-1", prompt + QUESTION, raw, salt("bob"))
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 0
    assert plan.is_empty()
    report = primed.finished(req)
    assert report.injected_tokens == 0
    assert "own user" in report.error
    # even bob's shared header is not loaded: the whole request is served as plain
    assert A in primed.facts.device


def test_bob_may_use_the_shared_header_but_not_alices_facts(primed: SchedulerSide) -> None:
    bob_fact = FactKey("bob", "fa")  # same name as alice's fact, in bob's namespace
    req = inject_request("bob-2", ((HEADER, HEADER_IDS), (bob_fact, A_IDS)), user="bob")
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 8
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0)]
    assert primed.finished(req).missing == (FactKey("bob", "fa"),)


@pytest.mark.parametrize("request_salt", [None, "", "inferscale-other", "bob", "other-layout"])
def test_inject_without_its_cache_salt_injects_nothing(primed: SchedulerSide,
                                                       request_salt: str | None) -> None:
    value = {"bob": salt("bob"), "other-layout": salt("alice", "L2")}.get(
        request_salt or "", request_salt)
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS))
    req = request("nosalt", prompt + QUESTION,
                  RequestParams("alice", LAYOUT, inject=tuple(spans)), value)
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 0
    assert plan.is_empty()
    report = primed.finished(req)
    assert report.injected_tokens == 0
    assert "cache_salt" in report.error


def test_unsalted_request_still_captures(side: SchedulerSide) -> None:
    # the salt guards injection only; captures and evictions of the request still run
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS))
    params = RequestParams("alice", LAYOUT, capture=(spans[1],), inject=(spans[0],))
    req = request("mixed", prompt + QUESTION, params, salt=None)
    claimed, plan = schedule(side, req, [4, 8])
    assert claimed == 0
    assert plan.captures == [CaptureOp("mixed", [4, 8], [spans[1]])]
    report = side.finished(req)
    assert report.captured == (FactKey("alice", "fa"),)
    assert "cache_salt" in report.error


def test_malformed_params_are_served_plain_with_an_error(side: SchedulerSide) -> None:
    req = request("bad", HEADER_IDS + QUESTION,
                  {PARAMS_KEY: {"user": "alice", "inject": [["alice", "f", 0, 999]]}}, salt())
    claimed, plan = schedule(side, req, [4])
    assert claimed == 0 and plan.is_empty()
    assert "outside the prompt" in side.finished(req).error


# -- registry upkeep --------------------------------------------------------------------


def test_already_registered_spans_are_not_captured_again(primed: SchedulerSide) -> None:
    before = dict(primed.facts.device)
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS), (C, C_IDS))
    req = request("again", prompt + QUESTION,
                  RequestParams("alice", LAYOUT, capture=tuple(spans)))
    _, plan = schedule(primed, req, [6, 7])
    assert plan.captures == [CaptureOp("again", [6, 7], [spans[2]])]  # only C is new
    assert primed.finished(req).captured == (FactKey("alice", "fc"),)
    assert {k: primed.facts.device[k] for k in before} == before


def test_recapture_with_other_tokens_replaces_the_registration(primed: SchedulerSide) -> None:
    new_a = [t + 1000 for t in A_IDS[:7]]  # the fact's text changed
    capture_all(primed, "recap", parts=((HEADER, HEADER_IDS), (A, new_a)))
    assert primed.facts.device[A].length == 7
    old = inject_request("old", ((HEADER, HEADER_IDS), (A, A_IDS)))
    assert schedule(primed, old, [1, 2])[0] == 8
    new = inject_request("new", ((HEADER, HEADER_IDS), (A, new_a)))
    assert schedule(primed, new, [1, 2])[0] == 15


def test_eviction_drops_the_entry_and_reaches_the_workers(primed: SchedulerSide) -> None:
    req = request("ev", HEADER_IDS[:1], RequestParams("alice", LAYOUT, evict=(A, C)))
    claimed, plan = schedule(primed, req, [9])
    assert claimed == 0
    assert plan.evicts == [A, C]  # unknown keys are forwarded too: the pool may hold them
    assert A not in primed.facts.device and B in primed.facts.device
    assert primed.build_plan([]).evicts == []
    primed.finished(req)
    inj = inject_request("after", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    claimed, plan = schedule(primed, inj, [1, 2])
    assert claimed == 8
    assert primed.finished(inj).missing == (FactKey("alice", "fa"), FactKey("alice", "fb"))


def test_load_recorded_before_an_eviction_in_the_same_step_stays(primed: SchedulerSide) -> None:
    # The worker runs a step's loads before its evictions, so both can share a step.
    inj = inject_request("inj", ((HEADER, HEADER_IDS), (A, A_IDS)))
    ev = request("ev", HEADER_IDS[:1], RequestParams("alice", LAYOUT, evict=(A,)))
    claimed = primed.num_matched_tokens(inj, 0)
    primed.after_alloc(inj, [1, 2], claimed)
    primed.after_alloc(ev, [3], 0)
    plan = primed.build_plan([])
    assert [op.req_id for op in plan.loads] == ["inj"] and plan.evicts == [A]


# -- chunked and preempted captures -----------------------------------------------------


def test_chunked_capture_emits_spans_once_computed(side: SchedulerSide) -> None:
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS), (C, QUESTION))
    req = request("chunk", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:3])))
    _, plan1 = schedule(side, req, [11], chunk=16)  # computes [0, 16)
    assert plan1.captures == [CaptureOp("chunk", [11], [spans[0]])]
    plan2 = continue_step(side, req, 16, 4, new_blocks=[12])  # [16, 20): A ends at 20
    assert plan2.captures == [CaptureOp("chunk", [11, 12], [spans[1]])]
    plan3 = continue_step(side, req, 20, 9, new_blocks=None)  # [20, 29): B not done
    assert plan3.captures == []
    assert "chunk" in side.capturing
    plan4 = continue_step(side, req, 29, 11, new_blocks=[13])  # [29, 40)
    assert plan4.captures == [CaptureOp("chunk", [11, 12, 13], [spans[2]])]
    assert "chunk" not in side.capturing  # its later steps are not read
    assert continue_step(side, req, 40, 1).captures == []  # decode step: nothing left
    side.finished(req)
    assert set(side.facts.device) == {HEADER, A, B}


def test_unfinished_capture_registers_only_emitted_spans(side: SchedulerSide) -> None:
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS), (C, QUESTION))
    req = request("abort", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:2])))
    _, plan = schedule(side, req, [11], chunk=16)
    assert [s.key for op in plan.captures for s in op.spans] == [HEADER]
    assert "abort" in side.capturing
    report = side.finished(req)  # aborted after the first chunk
    assert report.captured == (HEADER,)
    assert not side.capturing  # the steps no longer read it
    assert set(side.facts.device) == {HEADER}


@pytest.mark.parametrize("as_new", [False, True], ids=["resumed-cached", "resumed-new"])
def test_resumed_capture_uses_its_new_blocks(side: SchedulerSide, as_new: bool) -> None:
    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS), (C, QUESTION))
    req = request("pre", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:2])))
    _, plan = schedule(side, req, [11], chunk=16)
    assert plan.captures[0].block_ids == [11]
    # preempted, then admitted again from scratch with other blocks: vLLM's V1 model
    # runner lists it among the cached requests as resumed, the V2 runner as a new one
    if as_new:
        _, plan = schedule(side, req, [21, 22])
    else:
        assert side.num_matched_tokens(req, 0) == 0
        side.after_alloc(req, [21, 22], 0)
        plan = continue_step(side, req, 0, 30, new_blocks=[21, 22], resumed=True)
    assert plan.captures == [CaptureOp("pre", [21, 22], [spans[1]])]
    assert side.finished(req).captured == (HEADER, A)


def test_two_requests_in_one_step(primed: SchedulerSide) -> None:
    inj = inject_request("inj", ((HEADER, HEADER_IDS), (B, B_IDS)))
    prompt, spans = layout((HEADER, HEADER_IDS), (C, C_IDS))
    cap = request("cap2", prompt + QUESTION,
                  RequestParams("alice", LAYOUT, capture=(spans[1],)))
    claimed = primed.num_matched_tokens(inj, 0)
    primed.after_alloc(inj, [1, 2], claimed)
    primed.after_alloc(cap, [3, 4], 0)
    plan = primed.build_plan([
        ScheduledRequest("inj", claimed, len(inj.prompt_token_ids) - claimed, None, False),
        ScheduledRequest("cap2", 0, len(cap.prompt_token_ids), None, False)])
    assert plan.loads == [LoadOp("inj", [1, 2], [(HEADER, 0, 8, 0), (B, 0, 10, 8)])]
    assert plan.captures == [CaptureOp("cap2", [3, 4], [spans[1]])]


# -- the scheduler's questions have no side effects --------------------------------------


def test_num_matched_tokens_is_side_effect_free(primed: SchedulerSide) -> None:
    req = inject_request("q", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    before = copy.deepcopy(primed.facts.device)
    assert primed.num_matched_tokens(req, 0) == 30
    assert primed.num_matched_tokens(req, 0) == 30
    assert primed.num_matched_tokens(req, 16) == 14
    assert primed.facts.device == before
    # nothing was planned: no load before update_state_after_alloc
    assert primed.build_plan([]).is_empty()
    # and nothing is reported for a request that was only asked about
    assert primed.finished(req) is None


def test_finished_without_scheduling_reports_nothing(side: SchedulerSide) -> None:
    req = request("never", HEADER_IDS, None)
    assert side.finished(req) is None


# -- through the connector class vLLM instantiates, with vLLM's own records -----------------


def vllm_request(view: RequestView) -> Any:
    """vLLM's ``Request`` of a view: its params in ``SamplingParams.extra_args``."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    raw = view.kv_transfer_params
    extra = {"kv_transfer_params": raw} if raw is not None else None
    return Request(view.request_id, list(view.prompt_token_ids),
                   SamplingParams(max_tokens=1, extra_args=extra), None,
                   cache_salt=view.cache_salt)


def scheduler_output(scheduled: dict[str, int], new: tuple[tuple[Any, list[int]], ...] = (),
                     cached: tuple[tuple[Any, list[int] | None], ...] = (),
                     resumed: frozenset[str] = frozenset()) -> Any:
    """vLLM's ``SchedulerOutput`` of a step: ``new`` requests with all their blocks,
    ``cached`` ones (running, or ``resumed``) with the blocks the step adds."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    output = SchedulerOutput.make_empty()
    output.scheduled_new_reqs = [NewRequestData.from_request(req, (blocks,))
                                 for req, blocks in new]
    data = CachedRequestData.make_empty()
    data.req_ids = [req.request_id for req, _ in cached]
    data.new_block_ids = [(blocks,) if blocks is not None else None for _, blocks in cached]
    data.num_computed_tokens = [req.num_computed_tokens for req, _ in cached]
    if resumed:
        data.resumed_req_ids = set(resumed)
    output.scheduled_cached_reqs = data
    output.num_scheduled_tokens = scheduled
    return output


@pytest.fixture(scope="module")
def vllm_config() -> Any:
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig

    from inferscale_memory.connector import kv_transfer_config

    return VllmConfig(kv_transfer_config=kv_transfer_config())


@pytest.fixture
def connector(vllm_config: Any) -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from inferscale_memory.connector.connector import InferScaleConnector

    return InferScaleConnector(vllm_config, KVConnectorRole.SCHEDULER, None)


def admit(connector: Any, req: Any, block_ids: list[int], local_hit: int = 0) -> int:
    """vLLM's scheduler admitting ``req``: asks for its match (twice: asking changes
    nothing), allocates its blocks; returns the tokens claimed."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    claimed, is_async = connector.get_num_new_matched_tokens(req, local_hit)
    assert is_async is False  # loads must finish before the forward pass
    assert connector.get_num_new_matched_tokens(req, local_hit) == (claimed, False)
    blocks = KVCacheBlocks(blocks=([KVCacheBlock(i) for i in block_ids],))
    connector.update_state_after_alloc(req, blocks, claimed)
    req.num_computed_tokens = local_hit + claimed
    return claimed


def step_plan(connector: Any, output: Any) -> StepPlan:
    from inferscale_memory.connector.connector import InferScaleMetadata

    meta = connector.build_connector_meta(output)
    assert isinstance(meta, InferScaleMetadata)
    return meta.plan


def test_connector_shim_with_real_vllm_objects(connector: Any) -> None:
    def step(req: Any, block_ids: list[int]) -> tuple[int, StepPlan]:
        claimed = admit(connector, req, block_ids)
        scheduled = {req.request_id: req.num_prompt_tokens - claimed}
        return claimed, step_plan(connector, scheduler_output(scheduled, new=((req, block_ids),)))

    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS))
    cap = vllm_request(request("cap", prompt + QUESTION,
                               RequestParams("alice", LAYOUT, capture=tuple(spans))))
    claimed, plan = step(cap, [5, 6])
    assert claimed == 0 and plan.captures == [CaptureOp("cap", [5, 6], spans)]
    delay, report = connector.request_finished(cap, [5, 6])
    assert delay is False
    assert report == {PARAMS_KEY: {"captured": [["", HEADER.name], ["alice", "fa"]],
                                   "injected_tokens": 0, "missing": []}}

    inj = vllm_request(inject_request("inj", ((HEADER, HEADER_IDS), (A, A_IDS))))
    claimed, plan = step(inj, [7, 8])
    assert claimed == 20
    assert plan.loads == [LoadOp("inj", [7, 8], [(HEADER, 0, 8, 0), (A, 0, 12, 8)])]
    assert connector.request_finished(inj, [7, 8])[1] == {
        PARAMS_KEY: {"captured": [], "injected_tokens": 20, "missing": []}}


def test_connector_shim_follows_a_chunked_then_preempted_capture(connector: Any) -> None:
    from vllm.v1.core.sched.output import CachedRequestData

    prompt, spans = layout((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS), (C, QUESTION))
    req = vllm_request(request("chunk", prompt,
                               RequestParams("alice", LAYOUT, capture=tuple(spans[:3]))))
    admit(connector, req, [11])
    plan = step_plan(connector, scheduler_output({"chunk": 16}, new=((req, [11]),)))
    assert plan.captures == [CaptureOp("chunk", [11], [spans[0]])]  # [0, 16)
    req.num_computed_tokens = 16
    plan = step_plan(connector, scheduler_output({"chunk": 4}, cached=((req, [12]),)))
    assert plan.captures == [CaptureOp("chunk", [11, 12], [spans[1]])]  # [16, 20)
    # Preempted, then admitted again from scratch with other blocks: listed among the
    # cached requests as resumed, or (vLLM 0.34, which has no resumed_req_ids) as new.
    req.num_computed_tokens = 0
    admit(connector, req, [21, 22, 23])
    if hasattr(CachedRequestData.make_empty(), "resumed_req_ids"):
        output = scheduler_output({"chunk": 40}, cached=((req, [21, 22, 23]),),
                                  resumed=frozenset({"chunk"}))
    else:
        output = scheduler_output({"chunk": 40}, new=((req, [21, 22, 23]),))
    assert step_plan(connector, output).captures == [
        CaptureOp("chunk", [21, 22, 23], [spans[2]])]
    report = connector.request_finished(req, [21, 22, 23])[1]
    assert ConnectorReport.from_output(report).captured == (HEADER, A, B)


# -- a fact recaptured with other tokens while injections are scheduled -------------------


def test_fact_being_recaptured_is_not_claimed_before_the_capture_finishes(
        primed: SchedulerSide) -> None:
    # With async scheduling (vLLM's default on GPU), step N+1 is scheduled before the
    # outputs of step N are processed. Step N captures A's new text: the worker overwrites
    # A's pool entry during step N. A request scheduled for step N+1 with A's *old* tokens
    # must not claim A, or it would load the new text's KV for the old tokens.
    new_a = [t + 1000 for t in A_IDS]  # same length, other tokens
    prompt, spans = layout((HEADER, HEADER_IDS), (A, new_a))
    recap = request("recap", prompt + QUESTION,
                    RequestParams("alice", LAYOUT, capture=tuple(spans)))
    _, plan_n = schedule(primed, recap, [1, 2])  # step N
    assert plan_n.captures == [CaptureOp("recap", [1, 2], [spans[1]])]
    old = inject_request("old", ((HEADER, HEADER_IDS), (A, A_IDS)))
    claimed, plan = schedule(primed, old, [3, 4])  # step N+1, before recap finished
    assert claimed == 8
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0)]
    primed.finished(recap)
    new = inject_request("new", ((HEADER, HEADER_IDS), (A, new_a)))
    assert schedule(primed, new, [5, 6])[0] == 20


def test_older_of_two_concurrent_captures_does_not_win(primed: SchedulerSide) -> None:
    # Two captures of the same key with different tokens: the pool keeps the KV of the
    # last one captured; the registry must describe that one, whatever order they finish.
    first, second = [t + 1000 for t in A_IDS], [t + 2000 for t in A_IDS]
    reqs = []
    for name, ids in (("c1", first), ("c2", second)):
        prompt, spans = layout((HEADER, HEADER_IDS), (A, ids))
        reqs.append(request(name, prompt + QUESTION,
                            RequestParams("alice", LAYOUT, capture=(spans[1],))))
        schedule(primed, reqs[-1], [1, 2])  # c1 in step N, c2 in step N+1
    primed.finished(reqs[1])
    primed.finished(reqs[0])  # the older capture finishes last
    for name, ids, expected in (("i1", first, 8), ("i2", second, 20)):
        req = inject_request(name, ((HEADER, HEADER_IDS), (A, ids)))
        assert schedule(primed, req, [3, 4])[0] == expected, name


def test_eviction_during_a_capture_is_not_undone_by_its_finish(
        primed: SchedulerSide) -> None:
    # Evicting A after its capture step (the worker drops the pool entry) but before the
    # capture request finished must not leave A registered without KV in the pool.
    prompt, spans = layout((HEADER, HEADER_IDS), (C, C_IDS))
    cap = request("cap-c", prompt + QUESTION,
                  RequestParams("alice", LAYOUT, capture=(spans[1],)))
    schedule(primed, cap, [1, 2])
    ev = request("ev", HEADER_IDS[:1], RequestParams("alice", LAYOUT, evict=(C,)))
    _, plan = schedule(primed, ev, [3])
    assert plan.evicts == [C]
    primed.finished(ev)
    primed.finished(cap)
    assert C not in primed.facts.device


def test_user_cannot_capture_the_shared_header_after_its_own_tokens(
        side: SchedulerSide) -> None:
    # bob captures the header's tokens after a prefix of his own: that KV is not the
    # header's, and alice's requests (whose header tokens match) must never load it.
    junk = [900, 901, 902]
    raw = {PARAMS_KEY: {"user": "bob", "layout": LAYOUT,
                        "capture": [["", HEADER.name, 3, 11]]}}
    cap = request("bob-cap", junk + HEADER_IDS + QUESTION, raw)
    _, plan = schedule(side, cap, [1])
    assert plan.captures == []
    assert side.finished(cap).error
    inj = inject_request("alice", ((HEADER, HEADER_IDS), (A, A_IDS)))
    assert schedule(side, inj, [2, 3])[0] == 0


# -- a pool budget: least recently used facts are evicted on every worker -------------------


def test_budget_makes_room_by_evicting_least_recently_used_facts() -> None:
    # HEADER 8 + A 12 + B 10 = 30 tokens; a budget of 25 holds the header and one fact.
    side = SchedulerSide(budget_tokens=25)
    report = capture_all(side)  # one request: B finds no room (A is in flight), skipped
    assert report is not None
    assert sorted(report.captured) == sorted([HEADER, A])
    assert report.evicted == ()
    assert set(side.facts.device) == {HEADER, A} and side.facts.device_tokens == 20

    # Capturing B makes room in the same step: A (least recently used) is evicted on the
    # workers before B is stored; the header is never evicted.
    prompt, spans = layout((HEADER, HEADER_IDS), (B, B_IDS), (FactKey("alice", "q"), QUESTION))
    req = request("cap2", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:-1])))
    _, plan = schedule(side, req, [1, 2, 3])
    assert plan.moves == [(EVICT, A)] and plan.evicts == []
    assert [span.key for op in plan.captures for span in op.spans] == [B]
    report = side.finished(req)
    assert report is not None and report.evicted == (A,)
    assert set(side.facts.device) == {HEADER, B} and side.facts.device_tokens == 18
    assert side.facts.evictions == 1

    # A request naming A is told it is missing (recomputed), B is still injected.
    req = inject_request("r", ((HEADER, HEADER_IDS), (B, B_IDS), (A, A_IDS)))
    claimed, _ = schedule(side, req, [1, 2, 3])
    assert claimed == len(HEADER_IDS) + len(B_IDS)
    report = side.finished(req)
    assert report is not None and report.missing == (A,)


def test_an_evict_request_reports_the_facts_it_dropped_and_the_pool_after_it() -> None:
    side = SchedulerSide(budget_tokens=100)
    capture_all(side)  # HEADER 8, A 12, B 10
    assert side.facts.device_tokens == 30
    req = request("ev", HEADER_IDS[:1], RequestParams("alice", LAYOUT, evict=(A, C)))
    schedule(side, req, [9])
    report = side.finished(req)
    assert report is not None
    # C was never held: only A is named, and the pool's tokens show its rows given back
    assert report.deleted == (A,)
    assert report.pool_tokens == 18 and report.budget_tokens == 100
    again = request("ev2", HEADER_IDS[:1], RequestParams("alice", LAYOUT, evict=(A,)))
    schedule(side, again, [9])
    report = side.finished(again)
    assert report is not None and report.deleted == ()


def test_injection_refreshes_recency() -> None:
    side = SchedulerSide(budget_tokens=8 + 12 + 10 + 5)
    capture_all(side)  # HEADER, A, B
    req = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS)))
    schedule(side, req, [1, 2, 3])
    side.finished(req)  # A is now more recent than B
    report = capture_all(side, "cap2", ((HEADER, HEADER_IDS), (C, C_IDS + [1])))
    assert report is not None and report.evicted == (B,)
    assert set(side.facts.device) == {HEADER, A, C}


def test_a_fact_larger_than_the_budget_is_not_captured() -> None:
    side = SchedulerSide(budget_tokens=15)
    report = capture_all(side, parts=((HEADER, HEADER_IDS), (A, A_IDS)))
    assert report is not None and report.captured == (HEADER,)
    assert set(side.facts.device) == {HEADER} and side.facts.device_tokens == 8


def test_registered_tokens_follow_every_change() -> None:
    side = SchedulerSide(budget_tokens=1000)
    capture_all(side)
    assert side.facts.device_tokens == len(HEADER_IDS) + len(A_IDS) + len(B_IDS)
    evict = request("e", QUESTION, RequestParams("alice", LAYOUT, evict=(A,)))
    schedule(side, evict, [1])
    side.finished(evict)
    assert side.facts.device_tokens == len(HEADER_IDS) + len(B_IDS)
    capture_all(side, "cap2", ((HEADER, HEADER_IDS), (B, B_IDS[:4])))  # B recaptured shorter
    assert side.facts.device_tokens == len(HEADER_IDS) + 4
    assert side.facts.evictions == 0


# -- a host-memory tier under the device pool ----------------------------------------------


def _capture_b_over_a(side: SchedulerSide) -> tuple[StepPlan, ConnectorReport | None]:
    """HEADER and A registered (B found no room beside A in flight), then B captured."""
    capture_all(side)
    prompt, spans = layout((HEADER, HEADER_IDS), (B, B_IDS), (FactKey("alice", "q"), QUESTION))
    req = request("cap2", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:-1])))
    _, plan = schedule(side, req, [1, 2, 3])
    return plan, side.finished(req)


def test_room_is_made_by_demoting_to_the_host_tier() -> None:
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=30)
    plan, report = _capture_b_over_a(side)
    assert plan.moves == [(DEMOTE, A)] and plan.evicts == []
    assert report is not None
    assert report.demoted == (A,) and report.evicted == ()
    assert report.host_tokens == len(A_IDS) and report.host_budget_tokens == 30
    assert set(side.facts.device) == {HEADER, B} and set(side.facts.host) == {A}
    assert side.facts.demotions == 1 and side.facts.evictions == 0


def test_a_demoted_fact_is_promoted_before_its_load_not_recomputed() -> None:
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=30)
    _capture_b_over_a(side)
    req = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS)))
    claimed, plan = schedule(side, req, [1, 2, 3])
    assert claimed == len(HEADER_IDS) + len(A_IDS)  # A is claimed from the host tier
    # B (least recently used, not loaded in this step) goes to the host first, then A
    # comes back; the workers replay the moves in this order before the loads.
    assert plan.moves == [(DEMOTE, B), (PROMOTE, A)]
    assert [piece[0] for op in plan.loads for piece in op.pieces] == [HEADER, A]
    report = side.finished(req)
    assert report is not None
    assert report.missing == ()
    assert report.promoted == (A,)
    assert report.demoted == (B,)
    assert set(side.facts.device) == {HEADER, A} and set(side.facts.host) == {B}
    assert side.facts.device_tokens <= 25 and side.facts.host_tokens == len(B_IDS)


def test_the_host_tier_drops_its_least_recently_used_facts() -> None:
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=len(A_IDS))
    _capture_b_over_a(side)  # A demoted: the host tier is full
    report = capture_all(side, "cap3", ((HEADER, HEADER_IDS), (C, C_IDS + [1, 2, 3])))
    assert report is not None
    assert report.demoted == (B,)
    assert report.evicted == (A,)  # made room for B there
    assert set(side.facts.host) == {B} and set(side.facts.device) == {HEADER, C}
    req = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS)))
    claimed, _ = schedule(side, req, [1, 2, 3])
    assert claimed == len(HEADER_IDS)  # A is gone from both tiers: recomputed
    report = side.finished(req)
    assert report is not None and report.missing == (A,)


def test_a_fact_larger_than_the_host_tier_is_evicted() -> None:
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=len(A_IDS) - 1)
    plan, report = _capture_b_over_a(side)
    assert plan.moves == [(EVICT, A)]
    assert report is not None and report.evicted == (A,)
    assert not side.facts.host


def test_a_fact_loaded_in_the_step_is_never_moved_to_make_room() -> None:
    # The moves run before the step's loads, so a victim loaded in the same step would
    # be gone from the device when its load runs.
    side = SchedulerSide(budget_tokens=8 + 12, host_budget_tokens=100)
    capture_all(side, parts=((HEADER, HEADER_IDS), (A, A_IDS)))
    inject = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS)))
    side.after_alloc(inject, [1, 2, 3], side.num_matched_tokens(inject, 0))
    prompt, spans = layout((HEADER, HEADER_IDS), (C, C_IDS), (FactKey("alice", "q"), QUESTION))
    cap = request("cap2", prompt, RequestParams("alice", LAYOUT, capture=tuple(spans[:-1])))
    side.after_alloc(cap, [4, 5, 6], side.num_matched_tokens(cap, 0))
    plan = side.build_plan([ScheduledRequest("r", 0, 10, None, False),
                            ScheduledRequest("cap2", 0, len(prompt), None, False)])
    assert plan.moves == []  # A stays; C found no room and is not captured
    assert [span.key for op in plan.captures for span in op.spans] == []
    assert [piece[0] for op in plan.loads for piece in op.pieces] == [HEADER, A]
    assert set(side.facts.device) == {HEADER, A}
    # In a later step, A is fair game again.
    report = capture_all(side, "cap3", ((HEADER, HEADER_IDS), (C, C_IDS)))
    assert report is not None and report.demoted == (A,)


def test_deleting_or_recapturing_a_demoted_fact_forgets_its_host_copy() -> None:
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=30)
    _capture_b_over_a(side)  # A on the host
    evict = request("e", QUESTION, RequestParams("alice", LAYOUT, evict=(A,)))
    _, plan = schedule(side, evict, [1])
    side.finished(evict)
    assert plan.evicts == [A] and not side.facts.host and side.facts.host_tokens == 0
    side2 = SchedulerSide(budget_tokens=25, host_budget_tokens=30)
    _capture_b_over_a(side2)
    capture_all(side2, "cap3", ((HEADER, HEADER_IDS), (A, A_IDS[:5])))  # A recaptured
    assert A in side2.facts.device and A not in side2.facts.host
    assert side2.facts.device[A].length == 5


# -- a load that failed on a worker -----------------------------------------------------


def test_a_fact_whose_load_failed_is_forgotten_reported_missing_and_recaptured() -> None:
    # A worker that cannot find a fact's rows (a fragmented slab dropped them, a promotion
    # found no room) fails its blocks; vLLM recomputes them. The scheduler side must then
    # stop claiming the fact and report it missing, so that the engine recaptures it
    # instead of recomputing it on every answer.
    side = SchedulerSide(block_size=16)
    capture_all(side)  # HEADER 0-8, A 8-20, B 20-30 in a prompt
    req = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    claimed, plan = schedule(side, req, [7, 8, 9])
    assert claimed == 30 and [p[0] for op in plan.loads for p in op.pieces] == [HEADER, A, B]
    side.load_failed({9})  # positions 32..47: the question only, nothing was loaded there
    assert set(side.facts.device) == {HEADER, A, B}
    side.load_failed({8})  # positions 16..31: the end of A and B
    assert set(side.facts.device) == {HEADER}
    evicts = side.build_plan([]).evicts
    assert set(evicts) == {A, B}  # whatever is left of them on the workers
    report = side.finished(req)
    assert report is not None
    assert report.missing == (A, B)
    assert report.injected_tokens == len(HEADER_IDS)
    # The next request claims the header only; A is captured again when asked.
    req = inject_request("r2", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    assert side.num_matched_tokens(req, 0) == len(HEADER_IDS)


def test_a_failed_header_load_keeps_the_header() -> None:
    # The shared header is captured once at start and never recaptured: forgetting it
    # would stop all injection.
    side = SchedulerSide(block_size=16)
    capture_all(side)
    req = inject_request("r", ((HEADER, HEADER_IDS), (A, A_IDS)))
    schedule(side, req, [7, 8])
    side.load_failed({7})  # the header and the start of A
    assert HEADER in side.facts.device and A not in side.facts.device


def test_a_deleted_fact_loaded_in_the_step_keeps_its_rows_until_the_step_ends() -> None:
    # The workers drop a fact deleted in a step after that step's loads if a load reads
    # it, but run the step's moves before the loads: its rows are not free for them.
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=30)
    _capture_b_over_a(side)  # device: HEADER 8 + B 10; host: A 12
    reader = inject_request("r1", ((HEADER, HEADER_IDS), (B, B_IDS)))
    side.after_alloc(reader, [1, 2], side.num_matched_tokens(reader, 0))
    delete = request("d", QUESTION, RequestParams("alice", LAYOUT, evict=(B,)))
    side.after_alloc(delete, [3], side.num_matched_tokens(delete, 0))
    wants_a = inject_request("r2", ((HEADER, HEADER_IDS), (A, A_IDS)))
    side.after_alloc(wants_a, [4, 5], side.num_matched_tokens(wants_a, 0))
    plan = side.build_plan([])
    assert (PROMOTE, A) not in plan.moves  # 8 + 10 (B, until its load) + 12 > 25
    assert A in side.facts.host and plan.evicts == [B]
    # The next step has B's rows.
    again = inject_request("r3", ((HEADER, HEADER_IDS), (A, A_IDS)))
    _, plan = schedule(side, again, [6, 7])
    assert plan.moves == [(PROMOTE, A)]


def test_a_promotion_that_finds_no_room_keeps_the_host_tier_within_its_budget() -> None:
    side = SchedulerSide(budget_tokens=25, host_budget_tokens=len(A_IDS))
    _capture_b_over_a(side)  # device: HEADER 8 + B 10; host: A 12 (full)
    capture_all(side, "cap3", ((HEADER, HEADER_IDS), (C, C_IDS)))  # device: + C 5
    req = inject_request("r", ((HEADER, HEADER_IDS), (B, B_IDS), (A, A_IDS)))
    _, plan = schedule(side, req, [1, 2, 3])
    # Demoting C would not make room for A beside B (loaded in this step too): A stays on
    # the host (and is recomputed), C on the device.
    assert plan.moves == []
    assert A in side.facts.host and side.facts.host_tokens == len(A_IDS)
    assert C in side.facts.device


def test_a_refused_recapture_is_not_undone_by_an_earlier_capture_finishing() -> None:
    # c1 captures A in step N; c2 recaptures A with a text too long for the budget in step
    # N+1: refused, and A's pool entry (c1's KV) is evicted on the workers. c1 finishing
    # afterwards must not register A, whose KV the workers no longer hold.
    side = SchedulerSide(budget_tokens=25)
    capture_all(side, "cap-header", ((HEADER, HEADER_IDS),))
    caps = []
    for name, ids in (("c1", A_IDS), ("c2", list(range(600, 620)))):
        prompt, spans = layout((HEADER, HEADER_IDS), (A, ids))
        caps.append(request(name, prompt + QUESTION,
                            RequestParams("alice", LAYOUT, capture=(spans[1],))))
        _, plan = schedule(side, caps[-1], [1, 2])
    assert plan.captures == [] and plan.evicts == [A]  # c2's step: refused, A dropped
    side.finished(caps[1])
    side.finished(caps[0])
    assert A not in side.facts.device and side.facts.device_tokens == len(HEADER_IDS)
    req = inject_request("i", ((HEADER, HEADER_IDS), (A, A_IDS)))
    assert schedule(side, req, [3, 4])[0] == len(HEADER_IDS)  # A is recomputed, not loaded


# -- a request's per-fact work is done once ------------------------------------------------


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The token spans the scheduler side hashes, through the real token_digest."""
    from inferscale_memory.connector import params, scheduler

    spans: list[list[int]] = []

    def counting_digest(token_ids: list[int]) -> bytes:
        spans.append(list(token_ids))
        return params.token_digest(token_ids)

    monkeypatch.setattr(scheduler, "token_digest", counting_digest)
    return spans


def test_a_request_asked_again_hashes_each_span_once(primed: SchedulerSide,
                                                     hashed: list[list[int]]) -> None:
    # vLLM asks again on every step a request waits for blocks, and once more to admit it.
    req = inject_request("again", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    assert [primed.num_matched_tokens(req, hit) for hit in (0, 0, 16)] == [30, 30, 14]
    assert hashed == [HEADER_IDS, A_IDS, B_IDS]
    capture_all(primed, "cap-c", ((HEADER, HEADER_IDS), (C, C_IDS)))  # the registry changes
    hashed.clear()
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 30 and hashed == []  # matched again, its prompt not hashed again
    assert plan.loads == [LoadOp("again", [4, 8], [(HEADER, 0, 8, 0), (A, 0, 12, 8),
                                                    (B, 0, 10, 20)])]
    primed.finished(req)  # what was kept for the request goes with it
    assert primed.num_matched_tokens(req, 0) == 30 and len(hashed) == 3


def test_a_request_asked_again_reads_no_fact_while_the_registry_is_unchanged(
        primed: SchedulerSide, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[FactKey] = []
    get = primed.facts.get
    monkeypatch.setattr(primed.facts, "get", lambda key: read.append(key) or get(key))
    req = inject_request("waits", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    assert primed.num_matched_tokens(req, 0) == 30
    assert read == [HEADER, A, B]
    assert [primed.num_matched_tokens(req, 0) for _ in range(5)] == [30] * 5
    assert read == [HEADER, A, B]


def test_a_forged_span_asked_again_is_still_not_claimed(primed: SchedulerSide,
                                                        hashed: list[list[int]]) -> None:
    forged_a = [t + 1 for t in A_IDS]  # same key, same length, other tokens
    req = inject_request("forged", ((HEADER, HEADER_IDS), (A, forged_a), (B, B_IDS)))
    assert [primed.num_matched_tokens(req, 0) for _ in range(3)] == [8, 8, 8]
    assert hashed == [HEADER_IDS, forged_a]  # the match stops at A: B is never hashed
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 8 and plan.loads[0].pieces == [(HEADER, 0, 8, 0)]
    assert primed.finished(req).missing == (FactKey("alice", "fa"), FactKey("alice", "fb"))


@pytest.mark.parametrize("change", ["recaptured", "evicted"])
def test_a_span_gone_stale_while_its_request_waits_is_not_loaded(
        primed: SchedulerSide, hashed: list[list[int]], change: str) -> None:
    req = inject_request("stale", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    assert primed.num_matched_tokens(req, 0) == 30
    if change == "recaptured":  # the fact's text changed: same key, same length
        capture_all(primed, "recap", ((HEADER, HEADER_IDS), (A, [t + 1 for t in A_IDS])))
    else:
        evict = request("ev", HEADER_IDS[:1], RequestParams("alice", LAYOUT, evict=(A,)))
        schedule(primed, evict, [9])
        primed.finished(evict)
    hashed.clear()
    claimed, plan = schedule(primed, req, [4, 8])
    assert claimed == 8 and hashed == []
    assert plan.loads[0].pieces == [(HEADER, 0, 8, 0)]
    assert primed.finished(req).missing == (FactKey("alice", "fa"), FactKey("alice", "fb"))


# -- the match against a reference, token by token ---------------------------------------

# How a fact sits in a prompt: as registered, with other tokens of the same length
# (forged), with one token more, never registered, after a gap, or registered again with
# other tokens once the request was first matched (stale).
PLACEMENTS = ["ok", "forged", "longer", "unknown", "gap", "stale"]


@settings(max_examples=150, deadline=None)
@given(placements=st.lists(st.sampled_from(PLACEMENTS), max_size=6),
       sizes=st.lists(st.integers(1, 6), min_size=6, max_size=6),
       question=st.integers(0, 3), hit=st.integers(0, 40))
def test_claims_and_loads_match_a_token_by_token_reference(
        placements: list[str], sizes: list[int], question: int, hit: int) -> None:
    side = SchedulerSide()
    side.facts.register(HEADER, Registered(token_digest(HEADER_IDS), len(HEADER_IDS)))
    prompt, spans, valid = list(HEADER_IDS), [Span(HEADER, 0, len(HEADER_IDS))], [True]
    for i, (placement, size) in enumerate(zip(placements, sizes, strict=False)):
        key, ids = FactKey("alice", f"f{i}"), [1000 * (i + 1) + t for t in range(size)]
        if placement != "unknown":
            side.facts.register(key, Registered(token_digest(ids), size))
        if placement == "gap":
            prompt.append(7)
        shown = {"forged": [t + 1 for t in ids], "longer": ids + [5]}.get(placement, ids)
        spans.append(Span(key, len(prompt), len(prompt) + len(shown)))
        valid.append(placement in ("ok", "stale") and valid[-1] and placement != "gap")
        prompt.extend(shown)
    prompt += QUESTION[:question]
    hit = min(hit, len(prompt) - 1) // 4 * 4
    req = request("r", prompt, RequestParams("alice", LAYOUT, inject=tuple(spans)), salt())
    side.num_matched_tokens(req, hit)  # matched, its digests kept
    for i, placement in enumerate(placements):  # then registered again with other text
        if placement == "stale":
            side.facts.register(FactKey("alice", f"f{i}"), Registered(b"other", sizes[i]))
            valid[i + 1:] = [False] * (len(valid) - i - 1)
    usable = [span for span, ok in zip(spans, valid, strict=True) if ok]
    claim_end = min(usable[-1].end if usable else 0, len(prompt) - 1)
    pieces = [(s.key, max(s.start, hit) - s.start, min(s.end, claim_end) - max(s.start, hit),
               max(s.start, hit)) for s in usable if max(s.start, hit) < min(s.end, claim_end)]
    assert side.num_matched_tokens(req, hit) == max(0, claim_end - hit)
    claimed, plan = schedule(side, req, list(range(len(prompt) // 16 + 1)), local_hit=hit)
    assert claimed == max(0, claim_end - hit)
    assert [op.pieces for op in plan.loads] == ([pieces] if claimed else [])
    report = side.finished(req)
    # Spans all under vLLM's own prefix hit are neither loaded nor recomputed.
    cached = hit >= min(spans[-1].end, len(prompt) - 1)
    assert report.missing == (() if cached else tuple(s.key for s in spans[len(usable):]))
    assert report.injected_tokens == claimed


def test_a_step_plan_crosses_to_other_worker_processes_intact(primed: SchedulerSide) -> None:
    # With more than one worker process vLLM pickles the step plan; keys come back as
    # keys (hashable, equal, of their own type), so the workers' pools still find them.
    import pickle

    pytest.importorskip("vllm")
    from inferscale_memory.connector.connector import InferScaleMetadata

    req = inject_request("p", ((HEADER, HEADER_IDS), (A, A_IDS), (B, B_IDS)))
    _, plan = schedule(primed, req, [4, 8])
    copied = pickle.loads(pickle.dumps(InferScaleMetadata(plan), protocol=5)).plan
    assert copied == plan
    assert all(type(key) is FactKey for key, *_ in copied.loads[0].pieces)
    assert {key: 1 for key, *_ in copied.loads[0].pieces}.keys() == {HEADER, A, B}


@pytest.mark.parametrize("local_hit", [30, 32])
def test_spans_held_by_the_prefix_cache_are_neither_matched_nor_reported_missing(
        primed: SchedulerSide, hashed: list[list[int]], monkeypatch: pytest.MonkeyPatch,
        local_hit: int) -> None:
    # The same facts asked again: vLLM's own prefix cache holds the header and every fact
    # (here C was never captured), so there is nothing to claim, hash, look up or recompute.
    read: list[FactKey] = []
    get = primed.facts.get
    monkeypatch.setattr(primed.facts, "get", lambda key: read.append(key) or get(key))
    req = inject_request(f"warm{local_hit}", ((HEADER, HEADER_IDS), (A, A_IDS), (C, C_IDS)),
                         tail=QUESTION)
    claimed, plan = schedule(primed, req, [4, 8, 9], local_hit=local_hit - 5)
    assert claimed == 0 and plan.loads == []
    assert hashed == [] and read == []
    report = primed.finished(req)
    assert report is not None and report.missing == () and report.injected_tokens == 0
    assert list(primed.facts.device)[-2:] == [HEADER, A]  # still marked recently used
    # A cold request for the same spans is matched as before: C is missing.
    cold = inject_request("cold", ((HEADER, HEADER_IDS), (A, A_IDS), (C, C_IDS)))
    assert schedule(primed, cold, [4, 8, 9])[0] == 20
    assert primed.finished(cold).missing == (C,)

"""The driver's scheduler side: vLLM's scheduler records read into the plain views that
the connector's scheduler side takes, built from vLLM's own objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from inferscale_memory.connector.step import RequestView, ScheduledRequest
from inferscale_memory.driver import scheduling

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import (  # noqa: E402
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from vllm.v1.request import Request  # noqa: E402

WIRE = {"inferscale": {"user": "u", "layout": "L"}}


def request(req_id: str, prompt: list[int], num_computed: int = 0) -> Request:
    req = Request(req_id, prompt, SamplingParams(
        max_tokens=1, extra_args={"kv_transfer_params": WIRE}), None, cache_salt="s")
    req.num_computed_tokens = num_computed
    return req


def test_a_request_is_read_once_and_forgotten_when_it_finishes() -> None:
    req = request("r", [1, 2, 3])
    views = scheduling.RequestViews()
    view = views.of(req)
    assert view == RequestView("r", [1, 2, 3], WIRE, "s")
    assert views.of(req) is view and len(views) == 1  # asked again: the same view
    assert views.pop(req) is view and len(views) == 0
    assert views.pop(req) == view  # finished without being asked: read then
    assert len(views) == 0


def test_a_prompt_of_embeddings_has_no_token_ids() -> None:
    import torch

    req = Request("e", None, SamplingParams(max_tokens=1), None,
                  prompt_embeds=torch.zeros(4, 8))
    assert scheduling.request_view(req) == RequestView("e", [], None, None)


def test_the_blocks_of_kv_cache_group_0() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    blocks = KVCacheBlocks(blocks=([KVCacheBlock(4), KVCacheBlock(9)],))
    assert scheduling.block_ids(blocks) == [4, 9]
    assert scheduling.block_ids(None) == []


def output_of(new: list[NewRequestData], cached: Any, scheduled: dict[str, int]) -> Any:
    output = SchedulerOutput.make_empty()
    output.scheduled_new_reqs = new
    output.scheduled_cached_reqs = cached
    output.num_scheduled_tokens = scheduled
    return output


def cached_requests(req_ids: list[str], new_block_ids: list[tuple[list[int], ...] | None],
                    num_computed: list[int], resumed: set[str]) -> Any:
    cached = CachedRequestData.make_empty()
    cached.req_ids, cached.new_block_ids = req_ids, new_block_ids
    cached.num_computed_tokens = num_computed
    if hasattr(cached, "resumed_req_ids"):
        cached.resumed_req_ids = resumed
    return cached


def test_a_step_holds_only_the_requests_followed() -> None:
    new = [NewRequestData.from_request(request(name, list(range(40)), 8), ([1, 2, 3],))
           for name in ("n1", "n2")]
    cached = cached_requests(["c1", "c2", "c3"], [([7],), None, ([5, 6],)], [16, 20, 0],
                             {"c3"})
    output = output_of(new, cached, {"n1": 32, "n2": 32, "c1": 4, "c2": 1, "c3": 40})
    resumed = hasattr(cached, "resumed_req_ids")  # up to vLLM 0.33
    assert scheduling.scheduled_requests(output, {"n2", "c1", "c2", "c3"}) == [
        ScheduledRequest("n2", 8, 32, None, False),
        ScheduledRequest("c1", 16, 4, [7], False),
        ScheduledRequest("c2", 20, 1, None, False),
        ScheduledRequest("c3", 0, 40, [5, 6], resumed)]
    assert scheduling.scheduled_requests(output, set()) == []


@dataclass
class CachedRequestData034:
    """vLLM 0.34's ``CachedRequestData`` as the driver reads it: no ``resumed_req_ids``
    (0.34 re-sends a resumed request among the new ones), so every cached request's new
    blocks add to those it has."""

    req_ids: list[str]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]


def test_a_step_of_vllm_0_34_resumes_no_cached_request() -> None:
    output = output_of([], CachedRequestData034(["c"], [([12],)], [16]), {"c": 4})
    assert scheduling.scheduled_requests(output, {"c"}) == [
        ScheduledRequest("c", 16, 4, [12], False)]


def test_the_blocks_that_failed_to_load() -> None:
    from vllm.v1.outputs import KVConnectorOutput

    assert scheduling.failed_block_ids(KVConnectorOutput(invalid_block_ids={3, 4})) == {3, 4}
    assert scheduling.failed_block_ids(KVConnectorOutput()) == set()

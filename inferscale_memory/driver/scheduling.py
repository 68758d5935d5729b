"""The driver's scheduler side: vLLM's scheduler records, read for the connector.

vLLM's engine core calls the connector's scheduler hooks with its own records: a
``Request``, the ``KVCacheBlocks`` allocated to it, each step's ``SchedulerOutput`` and the
workers' ``KVConnectorOutput``. This module reads them (and nothing else does) into the
plain views of :mod:`inferscale_memory.connector.step` that
:class:`~inferscale_memory.connector.scheduler.SchedulerSide` takes. Each read is checked
against the installed vLLM by ``tests/test_vllm_contract.py``.

The host cost of a request is measured (``scripts/host_cost.py``): a request's view is built
once, and a step's view holds only the requests the scheduler side follows, never one
record per running request.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from inferscale_memory.connector.step import RequestView, ScheduledRequest


def request_view(request: Any) -> RequestView:
    """A vLLM ``Request`` as the scheduler side reads it."""
    prompt = request.prompt_token_ids
    return RequestView(request.request_id, prompt if prompt is not None else [],
                       request.kv_transfer_params, request.cache_salt)


class RequestViews:
    """The view of each request vLLM asks the connector about, built on its first ask
    (vLLM asks on every step a request waits) and dropped when it finishes."""

    def __init__(self) -> None:
        self._views: dict[str, RequestView] = {}

    def of(self, request: Any) -> RequestView:
        view = self._views.get(request.request_id)
        if view is None:
            view = self._views[request.request_id] = request_view(request)
        return view

    def pop(self, request: Any) -> RequestView:
        """The request's view, forgotten here: vLLM is done with the request."""
        view = self._views.pop(request.request_id, None)
        return view if view is not None else request_view(request)

    def __len__(self) -> int:
        return len(self._views)


def block_ids(blocks: Any) -> list[int]:
    """The ids of vLLM's ``KVCacheBlocks`` of KV cache group 0 (the only group the
    connector supports), in position order."""
    return list(blocks.get_block_ids()[0]) if blocks is not None else []


def scheduled_requests(scheduler_output: Any,
                       following: Collection[str]) -> list[ScheduledRequest]:
    """The requests of one step's ``SchedulerOutput`` whose ids are in ``following``:
    the newly admitted ones first, then those scheduled again (running or resumed)."""
    if not following:  # the usual step: nothing is reading it
        return []
    num_scheduled = scheduler_output.num_scheduled_tokens
    found = [ScheduledRequest(req.req_id, req.num_computed_tokens,
                              num_scheduled.get(req.req_id, 0), None, False)
             for req in scheduler_output.scheduled_new_reqs if req.req_id in following]
    cached = scheduler_output.scheduled_cached_reqs
    # vLLM 0.34 dropped resumed_req_ids: it re-sends a resumed request among the new.
    resumed = getattr(cached, "resumed_req_ids", ())
    for i, req_id in enumerate(cached.req_ids):
        if req_id in following:
            new_blocks = cached.new_block_ids[i]
            found.append(ScheduledRequest(
                req_id, cached.num_computed_tokens[i], num_scheduled.get(req_id, 0),
                list(new_blocks[0]) if new_blocks is not None else None, req_id in resumed))
    return found


def failed_block_ids(connector_output: Any) -> set[int]:
    """The blocks the workers failed to load in a step (``KVConnectorOutput``), which
    vLLM recomputes."""
    return set(getattr(connector_output, "invalid_block_ids", None) or ())

"""What the scheduler side reads of vLLM: each request, and each step (plain data).

vLLM hands the connector its own records (``Request``, ``SchedulerOutput``,
``KVCacheBlocks``), whose shapes change between releases. The driver
(:mod:`inferscale_memory.driver.scheduling`) translates them into these, once per request
and once per step, so that :mod:`.scheduler` reads no vLLM object and is tested without
one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request, as the scheduler side reads it from its first match to its end."""

    request_id: str
    prompt_token_ids: Sequence[int]  # the prompt's token ids ([] for a prompt of embeddings)
    # SamplingParams.extra_args["kv_transfer_params"]: ours under PARAMS_KEY, if any
    kv_transfer_params: dict[str, Any] | None
    cache_salt: str | None  # the prompt's cache salt (injection requires its user's)


class ScheduledRequest(NamedTuple):
    """A request that a step schedules, as far as its captures need it."""

    req_id: str
    num_computed: int  # its tokens computed before this step
    num_scheduled: int  # its tokens this step computes
    # Cache blocks (KV cache group 0, in position order) this step gave it; None: none
    # beyond those it had (a newly admitted request's come with its allocation).
    new_block_ids: list[int] | None
    resumed: bool  # back from a preemption: new_block_ids replace all its blocks

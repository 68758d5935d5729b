"""The class vLLM instantiates: a thin shim over :mod:`.scheduler` and :mod:`.worker`.

vLLM creates one instance per role in separate processes:

* **Scheduler side** (engine core process). ``get_num_new_matched_tokens`` says how many
  prompt tokens after the prefix-cache hit are injected facts whose KV exists
  (``is_async=False``: loads finish before the forward pass). ``update_state_after_alloc``
  records each scheduled request's loads, captures and evictions with its block ids.
  ``build_connector_meta`` hands them to the workers for this step.
  ``request_finished`` registers captured facts and returns the request's report
  (:class:`~.report.ConnectorReport`: injected tokens, facts recomputed, pool moves) as
  the output's ``kv_transfer_params``. These hooks hand vLLM's records (``Request``,
  ``KVCacheBlocks``, ``SchedulerOutput``, ``KVConnectorOutput``) to
  :mod:`inferscale_memory.driver.scheduling`, which reads them into the plain views of
  :mod:`.step`: the scheduler side reads nothing of vLLM.
* **Worker side** (each worker process). ``register_kv_caches`` probes the cache layout.
  ``start_load_kv`` writes the facts' KV (keys shifted to their new positions) into the
  request's blocks before the forward pass. ``save_kv_layer`` copies captured spans out
  of each layer's cache after its attention ran; ``wait_for_save`` stores them in the pool.
  ``get_block_ids_with_load_errors`` reports blocks whose fact was missing, which vLLM
  then recomputes; the scheduler side learns of them in ``update_connector_output``,
  forgets those facts and reports them missing (so they are recaptured).

Configure it with :func:`inferscale_memory.connector.kv_transfer_config`.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from inferscale_memory import lifeline
from inferscale_memory.connector.plan import StepPlan
from inferscale_memory.connector.scheduler import SchedulerSide
from inferscale_memory.connector.worker import WorkerSide
from inferscale_memory.driver import engine as driver
from inferscale_memory.driver import scheduling
from inferscale_memory.errors import ConfigError
from inferscale_memory.fields import kv_cache_dtype_problem


class InferScaleMetadata(KVConnectorMetadata):
    """The step plan, sent from the scheduler side to every worker."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class InferScaleConnector(KVConnectorBase_V1):
    """Fact-KV capture and injection for vLLM (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        problem = kv_cache_dtype_problem(vllm_config.cache_config.cache_dtype)
        if problem is not None:  # `vllm serve --kv-cache-dtype fp8` with this connector
            raise ConfigError(problem)
        lifeline.watch_parent()  # this process (engine core, worker) ends with the engine's owner
        lifeline.leave_interrupts_to_owner()
        self._scheduler = (SchedulerSide(driver.pool_budget_tokens(vllm_config),
                                         driver.host_pool_budget_tokens(vllm_config),
                                         driver.cache_block_size(vllm_config))
                           if role == KVConnectorRole.SCHEDULER else None)
        self._views = scheduling.RequestViews()  # what the scheduler side reads of each request
        self._worker = WorkerSide(vllm_config) if role == KVConnectorRole.WORKER else None

    # -- worker side -------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load(self._plan())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous and complete in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        assert self._worker is not None
        plan = self._plan()
        if plan.captures:
            self._worker.save_layer(layer_name, plan)

    def wait_for_save(self) -> None:
        assert self._worker is not None
        plan = self._plan()
        if plan.captures:
            self._worker.finish_save(plan)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def _plan(self) -> StepPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, InferScaleMetadata)
        return meta.plan

    # -- scheduler side: vLLM's records read by the driver, plain views to SchedulerSide --

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        assert self._scheduler is not None
        view = self._views.of(request)
        return self._scheduler.num_matched_tokens(view, num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.after_alloc(self._views.of(request), scheduling.block_ids(blocks),
                                    num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._scheduler is not None
        scheduled = scheduling.scheduled_requests(scheduler_output, self._scheduler.capturing)
        return InferScaleMetadata(self._scheduler.build_plan(scheduled))

    def update_connector_output(self, connector_output: Any) -> None:
        assert self._scheduler is not None
        failed = scheduling.failed_block_ids(connector_output)
        if failed:
            self._scheduler.load_failed(failed)

    def request_finished(self, request: Any,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        report = self._scheduler.finished(self._views.pop(request))
        return False, report.to_output() if report is not None else None

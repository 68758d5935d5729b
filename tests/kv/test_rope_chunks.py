"""RotaryShift.apply rotates the moved tokens a chunk at a time: bit-identical to rotating
all of them at once (the formula below, as it was), with a bounded float32 working set.
No vLLM needed: the frequencies are the textbook ones."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from inferscale_memory.kv.rope import RotaryShift, Rotation


def whole(shift: RotaryShift, keys: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """The rotation of every token at once (the implementation before chunking)."""
    rot = keys[..., : shift.rotary_dim].to(torch.float32)
    if shift.is_neox_style:
        x1, x2 = rot.chunk(2, dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    y1 = x1 * rotation.cos - x2 * rotation.sin
    y2 = x2 * rotation.cos + x1 * rotation.sin
    if shift.is_neox_style:
        rotated = torch.cat((y1, y2), dim=-1)
    else:
        rotated = torch.stack((y1, y2), dim=-1).flatten(-2)
    out = keys.clone()
    moved = rotation.moved
    out[..., moved, :, : shift.rotary_dim] = rotated[..., moved, :, :].to(keys.dtype)
    return out


def make_shift(head: int, rotary_dim: int, neox: bool, chunk_bytes: int) -> RotaryShift:
    inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    return RotaryShift(inv_freq, rotary_dim, neox, chunk_bytes=chunk_bytes)


def sample(lead: tuple[int, ...], n: int, heads: int, head: int, dtype: torch.dtype,
           seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(*lead, n, heads, head, generator=g).to(dtype)
    deltas = torch.randint(-4000, 4000, (n,), generator=g)
    deltas[torch.rand(n, generator=g) < 0.3] = 0  # unmoved tokens in between
    return keys, deltas


def token_bytes(lead: tuple[int, ...], heads: int, rotary_dim: int) -> int:
    """float32 bytes of one token's rotary part over the leading (layer) dims."""
    return math.prod(lead) * heads * rotary_dim * 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("lead,n,heads,head,rotary_dim,tokens_per_chunk", [
    ((), 1, 1, 8, 8, 1),           # one token
    ((), 37, 3, 64, 64, 1),        # a token per chunk
    ((4,), 50, 2, 64, 32, 7),      # layers, partial rotary, chunks cross the moved tokens
    ((2, 3), 129, 2, 16, 16, 64),  # two leading dims, 2 full chunks and a remainder
    ((3,), 20, 4, 32, 32, 1000),   # one chunk holds everything
], ids=["one", "per-token", "layers-partial", "two-leading", "one-chunk"])
def test_chunked_rotation_is_bit_identical(dtype: torch.dtype, neox: bool,
                                           lead: tuple[int, ...], n: int, heads: int,
                                           head: int, rotary_dim: int,
                                           tokens_per_chunk: int) -> None:
    shift = make_shift(head, rotary_dim, neox, token_bytes(lead, heads, rotary_dim)
                       * tokens_per_chunk + 3)  # not a multiple: rounds down
    assert shift.chunk_tokens(sample(lead, 1, heads, head, dtype, 0)[0]) == tokens_per_chunk
    for seed in range(3):
        keys, deltas = sample(lead, n, heads, head, dtype, seed)
        rotation = shift.prepare(deltas, keys.device)
        if rotation is None:
            continue
        before = keys.clone()
        expected = whole(shift, keys, rotation)
        got = shift.apply(keys, rotation)
        assert got.dtype == dtype and got.shape == keys.shape
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))  # bits
        assert torch.equal(keys, before)  # apply leaves its input alone
        in_place = keys.clone()
        assert shift.apply_(in_place, rotation) is in_place
        assert torch.equal(in_place.view(torch.uint8), expected.view(torch.uint8))


def test_the_float32_working_set_is_bounded_by_chunk_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lead, n, heads, head = (6,), 300, 4, 64
    per_token = token_bytes(lead, heads, head)
    shift = make_shift(head, head, True, chunk_bytes=10 * per_token)
    keys, deltas = sample(lead, n, heads, head, torch.bfloat16, 1)
    rotation = shift.prepare(deltas, keys.device)
    assert rotation is not None
    working: list[int] = []
    rotate = RotaryShift._rotate

    def spy(self: RotaryShift, keys: torch.Tensor, tokens: torch.Tensor,
            rotation: Rotation) -> torch.Tensor:
        rotated = rotate(self, keys, tokens, rotation)
        working.append(rotated.numel() * 4)  # its float32 size, before the cast back
        return rotated

    monkeypatch.setattr(RotaryShift, "_rotate", spy)
    shift.apply(keys, rotation)
    moved = int(rotation.moved.sum())
    assert len(working) == math.ceil(moved / 10) > 1
    assert max(working) <= shift.chunk_bytes
    assert sum(working) == moved * per_token  # every moved token once, no other


def test_the_default_chunk_is_a_fraction_of_a_large_load() -> None:
    # 64 requests x 50 facts x 16 tokens of Llama-3.1-8B keys (32 layers, 8 heads, 128):
    # 6 GiB of float32 at once before; now chunks of at most the default chunk_bytes
    shift = make_shift(128, 128, True, chunk_bytes=RotaryShift.chunk_bytes)
    keys = torch.empty(32, 1, 8, 128, dtype=torch.bfloat16)
    tokens = 64 * 50 * 16
    assert tokens * token_bytes((32,), 8, 128) > 6 << 30
    assert shift.chunk_tokens(keys) * token_bytes((32,), 8, 128) <= 256 << 20


def test_no_rotation_means_no_copy() -> None:
    shift = make_shift(8, 8, True, chunk_bytes=64)
    keys, _ = sample((), 4, 1, 8, torch.bfloat16, 0)
    assert shift.prepare(torch.zeros(4, dtype=torch.int64), keys.device) is None
    assert shift.apply(keys, None) is keys and shift.apply_(keys, None) is keys


def test_chunk_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        dataclasses.replace(make_shift(8, 8, True, 64), chunk_bytes=0)

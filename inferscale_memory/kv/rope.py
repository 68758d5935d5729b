"""Moving cached keys to other positions ("chunked RoPE").

vLLM caches keys after RoPE. A key rotated at position ``p`` becomes the key of position
``q`` by one more rotation of angle ``(q - p) * inv_freq``: rotations compose exactly, so
the pool keeps keys as captured (tagged with their position) and a fact injected where it
was captured is copied bit for bit, with no rotation at all.

The frequencies come from the model's own rotary module (its cos/sin table), which
covers the scaled variants (llama3, linear, YaRN's frequencies); YaRN's magnitude factor
is already inside the captured key and is not applied twice.

The cos/sin of every delta come from a table (:class:`AngleTable`) of the deltas
``0 .. reach - 1``, built once per device and rebuilt twice as long when a longer move
comes: under ``2 x longest move x rotary_dim`` float32 values (16 MiB after a move of
16k tokens with 128 rotary dims; moves are bounded by the model's context). A load step then looks
its angles up instead of computing them: no kernel of its own on the fused path, which
reads the table in its kernel, and the same values on the portable path, so the two
paths write the same bits. A negative delta uses the table's cosine and the negated sine
(``cos(-a) = cos(a)``, ``sin(-a) = -sin(a)``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class RotaryShift:
    """Rotates keys by a per-token position delta.

    Attributes:
        inv_freq: ``(rotary_dim // 2,)`` float32 inverse frequencies.
        rotary_dim: Leading dims of each head that carry RoPE (partial rotary models).
        is_neox_style: Pairs ``(i, i + rotary_dim/2)`` (NeoX/Llama) or ``(2i, 2i+1)`` (GPT-J).
        chunk_bytes: Float32 bytes of keys rotated at once. A load step may move tens of
            thousands of tokens over every layer (6 GiB of float32 for 64 requests of 50
            facts on Llama-3.1-8B); their rotation works through them in chunks of this
            size, so its temporaries stay under about 4 chunks. One token is the least.
    """

    inv_freq: torch.Tensor
    rotary_dim: int
    is_neox_style: bool
    chunk_bytes: int = 64 << 20
    _tables: dict[torch.device, AngleTable] = field(default_factory=dict, init=False,
                                                    repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {self.chunk_bytes}")

    @classmethod
    def from_rotary_module(cls, rope: torch.nn.Module) -> RotaryShift:
        """Build from a vLLM ``RotaryEmbedding`` instance (the model's own), read by
        :func:`inferscale_memory.driver.engine.rotary_frequencies`."""
        from inferscale_memory.driver.engine import rotary_frequencies

        return cls(*rotary_frequencies(rope))

    def shift(self, keys: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        """Rotate ``keys`` (``[..., n, heads, head_dim]``) by ``deltas`` (``[n]`` ints).

        Tokens whose delta is 0 come back bit-identical.
        """
        return self.apply(keys, self.prepare(deltas, keys.device))

    def on(self, device: torch.device) -> RotaryShift:
        """This shift with its frequencies on ``device`` (copied once, not per step)."""
        return dataclasses.replace(self, inv_freq=self.inv_freq.to(device))

    def prepare(self, deltas: torch.Tensor, device: torch.device) -> Rotation | None:
        """The rotation of ``deltas``, prepared once and applied to every layer."""
        if not bool((deltas != 0).any()):
            return None
        return self.rotation(deltas.to(device), reach=int(deltas.abs().max()) + 1)

    def rotation(self, deltas: torch.Tensor, reach: int | None = None) -> Rotation:
        """The rotation of ``deltas`` (``[n]`` int64) on their own device: the caller
        knows some move. ``reach`` bounds ``|deltas|`` from above (the caller's host copy
        tells it); without it the deltas are read back from the device once."""
        if reach is None:
            reach = int(deltas.abs().max()) + 1
        return Rotation(deltas, self.table(reach, deltas.device))

    def table(self, reach: int, device: torch.device) -> AngleTable:
        """The angle table of ``device`` covering deltas ``0 .. reach - 1`` (kept, and
        rebuilt twice as long when a longer move comes)."""
        device = torch.device(device)
        table = self._tables.get(device)
        if table is None or table.reach < reach:
            size = max(1024, 1 << (max(reach, 1) - 1).bit_length())
            angles = (torch.arange(size, dtype=torch.float32, device=device)[:, None]
                      * self.inv_freq.to(device)[None, :])
            table = self._tables[device] = AngleTable(angles.cos(), angles.sin())
        return table

    def apply(self, keys: torch.Tensor, rotation: Rotation | None) -> torch.Tensor:
        """Rotate ``keys`` by a prepared rotation (``None``: nothing moves) into a copy."""
        if rotation is None:
            return keys
        return self.apply_(keys.clone(), rotation)

    def apply_(self, keys: torch.Tensor, rotation: Rotation | None) -> torch.Tensor:
        """Rotate ``keys`` in place (for keys that are a copy already, such as a gather)."""
        if rotation is None:
            return keys
        moved = rotation.moved.nonzero().squeeze(1)
        for tokens in moved.split(self.chunk_tokens(keys)):
            rotated = self._rotate(keys, tokens, rotation)
            keys[..., tokens, :, : self.rotary_dim] = rotated.to(keys.dtype)
        return keys

    def chunk_tokens(self, keys: torch.Tensor) -> int:
        """Tokens per chunk: as many as fit in ``chunk_bytes`` of float32 (at least 1)."""
        per_token = keys[..., 0, :, : self.rotary_dim].numel() * 4
        return max(1, self.chunk_bytes // max(1, per_token))

    def _rotate(self, keys: torch.Tensor, tokens: torch.Tensor,
                rotation: Rotation) -> torch.Tensor:
        """The rotated rotary dims of ``tokens`` (float32, ``[..., len(tokens), heads,
        rotary_dim]``); element by element the same arithmetic for any chunking."""
        rot = keys[..., tokens, :, : self.rotary_dim].to(torch.float32)
        cos, sin = rotation.cos[tokens], rotation.sin[tokens]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        if self.is_neox_style:
            return torch.cat((y1, y2), dim=-1)
        return torch.stack((y1, y2), dim=-1).flatten(-2)


@dataclass(frozen=True)
class AngleTable:
    """``cos`` and ``sin`` of ``delta x inv_freq`` for deltas ``0 .. reach - 1``
    (``[reach, rotary_dim / 2]`` float32, contiguous: the fused kernel indexes them)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @property
    def reach(self) -> int:
        return int(self.cos.shape[0])


@dataclass(frozen=True)
class Rotation:
    """A shift's per-token deltas (on the device) and the angle table that covers them.

    ``cos``, ``sin`` (``[n, 1, rotary_dim / 2]``, broadcast over heads) and ``moved`` are
    looked up on first use (the portable path); the fused kernel reads the table and the
    deltas itself.
    """

    deltas: torch.Tensor
    table: AngleTable

    @cached_property
    def moved(self) -> torch.Tensor:
        return self.deltas != 0

    @cached_property
    def cos(self) -> torch.Tensor:
        return self.table.cos[self.deltas.abs()][:, None, :]

    @cached_property
    def sin(self) -> torch.Tensor:
        sign = torch.where(self.deltas < 0, -1.0, 1.0).to(torch.float32)
        return (self.table.sin[self.deltas.abs()] * sign[:, None])[:, None, :]

"""What the scheduler side tells the worker side for one engine step (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferscale_memory.connector.params import FactKey, Span


def blocks_of(block_ids: list[int], block_size: int, position: int, length: int) -> list[int]:
    """The blocks of ``block_ids`` (in position order) that hold ``length`` tokens from
    prompt ``position``."""
    first, last = position // block_size, (position + length - 1) // block_size
    return block_ids[first:last + 1]


@dataclass
class LoadOp:
    """Write pool KV into one request's blocks before the forward pass."""

    req_id: str
    block_ids: list[int]  # the request's blocks (KV cache group 0), in position order
    # (key, first token of the fact to copy, number of tokens, prompt position it goes to)
    pieces: list[tuple[FactKey, int, int, int]]


@dataclass
class CaptureOp:
    """Copy the KV of prompt spans out of one request's blocks after its forward pass."""

    req_id: str
    block_ids: list[int]  # the request's blocks (KV cache group 0), in position order
    spans: list[Span]  # spans whose tokens are all computed by the end of this step


# Pool moves, replayed in order before the step's loads: room made for captures and
# promotions (never a fact this step loads).
EVICT, DEMOTE, PROMOTE = "evict", "demote", "promote"  # drop / device -> host / host -> device


@dataclass
class StepPlan:
    """Everything the worker side does in one step: pool moves, loads, captures, evictions."""

    loads: list[LoadOp] = field(default_factory=list)
    captures: list[CaptureOp] = field(default_factory=list)
    evicts: list[FactKey] = field(default_factory=list)  # deleted or replaced facts
    moves: list[tuple[str, FactKey]] = field(default_factory=list)  # (EVICT | DEMOTE | ...)

    def is_empty(self) -> bool:
        return not (self.loads or self.captures or self.evicts or self.moves)

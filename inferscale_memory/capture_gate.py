"""CaptureGate: how many capture tokens the engine is asked to compute at once.

vLLM schedules waiting requests first come, first served. An ``add`` of hundreds of facts
sends a capture request per fact, and a chat sent just after waits behind every one of
them: on the 2-core CPU, 200 captures of ~200 tokens are ~80 s of prefill. The gate lets
captures in while the capture tokens in flight fit its budget (the engine keeps two steps'
worth, :func:`capture_budget`, so its steps stay full of captures, and no more than half
the fact pool's free rows: a capture in flight holds its rows until it finishes, so
captures beyond the pool would find no room and be dropped) and holds the rest
back in the engine's own process, in arrival order, so a chat waits for at most that much
capture work. A capture larger than the budget still goes, alone.

Plain asyncio bookkeeping, no vLLM: tested without a model.

    >>> import asyncio
    >>> async def demo():
    ...     gate = CaptureGate(100)
    ...     async with gate.hold(60):
    ...         return gate.in_flight
    >>> asyncio.run(demo())
    60
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

STEPS_IN_FLIGHT = 2  # scheduler steps' worth of capture tokens the engine may hold


def capture_budget(max_num_batched_tokens: int, pool_room: int | None = None) -> int:
    """The gate's budget for an engine that computes ``max_num_batched_tokens`` a step,
    with ``pool_room`` token rows of its fact pool not held by headers (``None``: a pool
    without a budget). Half the room at most: the other half is for the facts that the
    answers of a step load, which stay put while they are read."""
    budget = STEPS_IN_FLIGHT * max(1, max_num_batched_tokens)
    return budget if pool_room is None else max(1, min(budget, pool_room // 2))


class CaptureGate:
    """Admits captures while their tokens in flight fit ``budget_tokens``, in arrival
    order (``None``: every capture at once). Used on one event loop."""

    def __init__(self, budget_tokens: int | None) -> None:
        if budget_tokens is not None and budget_tokens < 1:
            raise ValueError(f"budget_tokens must be >= 1 or None; got {budget_tokens}")
        self.budget_tokens = budget_tokens
        self.in_flight = 0  # tokens of the captures admitted and not yet done
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """Captures held back."""
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def hold(self, tokens: int) -> AsyncIterator[None]:
        """Wait until a capture of ``tokens`` may go, and count it in flight meanwhile."""
        await self._admit(tokens)
        try:
            yield
        finally:
            self.in_flight -= tokens
            self._wake()

    async def _admit(self, tokens: int) -> None:
        if not self._waiting and self._fits(tokens):
            self.in_flight += tokens
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append((tokens, turn))
        try:
            await turn  # _wake counted it in flight before setting it
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # admitted, then cancelled: give back
                self.in_flight -= tokens
            else:
                self._waiting.remove((tokens, turn))
            self._wake()
            raise

    def _fits(self, tokens: int) -> bool:
        return (self.budget_tokens is None or self.in_flight == 0
                or self.in_flight + tokens <= self.budget_tokens)

    def _wake(self) -> None:
        """Admit the waiting captures at the head of the line that fit now."""
        while self._waiting and self._fits(self._waiting[0][0]):
            tokens, turn = self._waiting.popleft()
            self.in_flight += tokens
            turn.set_result(None)

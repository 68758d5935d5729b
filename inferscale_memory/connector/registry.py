"""Which facts each KV tier holds, within its budget: the connector's one eviction policy.

Pure bookkeeping, no vLLM and no torch, like nano-vllm's block manager. The device tier
holds facts least recently used first; an optional host tier holds the facts demoted from
it, also least recently used first. Every decision to move or drop a fact is returned as
a :data:`Move`, which the scheduler side forwards to every worker in the step plan: the
workers replay the moves and never choose a victim themselves, so their pools hold what
the registry holds.

Budgets are token rows of one worker (:mod:`inferscale_memory.driver.engine` turns the
configured bytes into rows). The device budget also covers the captures in flight
(reserved when the capture is emitted, registered when its request finishes) and the rows
of facts deleted in a step that a load of the same step still reads.

The scheduler makes room on every capture, so no operation lists the facts held: running
totals say whether room can be made, and eviction walks the tiers from their cold ends.
The work per capture grows with the facts it moves, not with the facts held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from inferscale_memory.connector.params import SHARED_NS, FactKey
from inferscale_memory.connector.plan import DEMOTE, EVICT, PROMOTE

Move = tuple[str, FactKey]  # (EVICT | DEMOTE | PROMOTE, key), replayed by the workers


@dataclass(frozen=True)
class Registered:
    """What the scheduler knows of a captured fact."""

    digest: bytes  # token_digest of the captured tokens
    length: int  # number of tokens


@dataclass(frozen=True)
class Room:
    """The outcome of making room on the device for some tokens."""

    fits: bool  # the tokens fit the device budget now
    # The moves made for it, in order (none when they do not fit: no fact leaves the
    # device for a capture or promotion that cannot happen).
    moves: tuple[Move, ...] = ()


class FactRegistry:
    """Facts on the device and host tiers, least recently used first, within budgets.

    A shared header is never moved (every injection starts with it), nor is a fact
    pinned by a load of the step being planned (the workers run a step's moves before
    its loads).

    Example:
        >>> registry = FactRegistry(budget_tokens=20)
        >>> registry.register(FactKey("alice", "a"), Registered(b"", 12))
        >>> registry.reserve(10)
        Room(fits=True, moves=(('evict', FactKey(ns='alice', name='a')),))
    """

    def __init__(self, budget_tokens: int | None = None,
                 host_budget_tokens: int | None = None) -> None:
        self.budget_tokens = budget_tokens  # device tier; None: unbounded
        self.host_budget_tokens = host_budget_tokens or None  # None: no host tier
        # Read freely; changed only through the methods, which keep the counts right.
        self.device: OrderedDict[FactKey, Registered] = OrderedDict()  # LRU first
        self.host: OrderedDict[FactKey, Registered] = OrderedDict()  # demoted, LRU first
        self.device_tokens = 0
        self.host_tokens = 0
        self._shared_tokens = 0  # device tokens of shared headers (never movable)
        self._pinned_tokens = 0  # device tokens of pinned facts other than headers
        self.evictions = 0
        self.demotions = 0
        self.promotions = 0
        # Bumped by every change of either tier's contents (recency aside): what a caller
        # derived from get() at an older version may be stale, at this one it is not.
        self.version = 0
        self._reserved = 0  # tokens of captures in flight: emitted, not yet registered
        self._held = 0  # tokens of facts deleted in this step that a load of it reads
        self._pinned: set[FactKey] = set()  # facts loaded in this step

    # -- questions ---------------------------------------------------------------------

    def get(self, key: FactKey) -> Registered | None:
        """The fact's registration in either tier (its recency is left as it is)."""
        return self.device.get(key) or self.host.get(key)

    def is_on_host(self, key: FactKey) -> bool:
        return key in self.host

    # -- registering and forgetting ----------------------------------------------------

    def register(self, key: FactKey, entry: Registered) -> None:
        """A captured fact, on the device and most recently used; it replaces any older
        registration of ``key`` in either tier."""
        self.forget(key)
        self._add_to_device(key, entry)

    def forget(self, key: FactKey) -> None:
        """Drop ``key`` from both tiers (the workers drop both with it)."""
        self._remove_from_device(key)
        entry = self.host.pop(key, None)
        if entry is not None:
            self._count_on_host(-entry.length)

    def delete(self, key: FactKey) -> bool:
        """Forget a fact a request deleted; whether either tier held it. If a load of this
        step reads it, the workers drop it only after the step's loads, but run the step's
        moves before them: its tokens stay counted until :meth:`end_step`, so that no move
        is given its rows."""
        entry = self.device.get(key)
        held = entry is not None or key in self.host
        if entry is not None and key in self._pinned:
            self._held += entry.length
        self.forget(key)
        return held

    def touch(self, key: FactKey) -> None:
        """Mark a fact on the device most recently used (a request injected it)."""
        if key in self.device:
            self.device.move_to_end(key)

    # -- the step being planned --------------------------------------------------------

    def pin(self, keys: Iterable[FactKey]) -> None:
        """Never move these facts until :meth:`end_step`: a load of this step reads them."""
        for key in keys:
            if key not in self._pinned:
                self._pinned.add(key)
                self._pinned_tokens += self._unmovable_length(key)

    def end_step(self) -> None:
        """The step's plan is complete: its pins and held tokens no longer count."""
        self._pinned.clear()
        self._pinned_tokens = 0
        self._held = 0

    def reserve(self, tokens: int) -> Room:
        """Make room for a capture of ``tokens`` and count them in flight until
        :meth:`release`; nothing is reserved if they do not fit.

        Raises:
            ValueError: ``tokens`` is negative.
        """
        if tokens < 0:
            raise ValueError(f"cannot reserve {tokens} tokens")
        room = self._make_room(tokens)
        if room.fits:
            self._reserved += tokens
        return room

    def release(self, tokens: int) -> None:
        """A capture request finished: its reserved tokens are no longer in flight (the
        facts it stored are registered on their own).

        Raises:
            ValueError: More tokens than are reserved.
        """
        if not 0 <= tokens <= self._reserved:
            raise ValueError(f"cannot release {tokens} tokens, {self._reserved} reserved")
        self._reserved -= tokens

    def promote(self, key: FactKey) -> Room:
        """Bring a demoted fact back to the device for a load of this step.

        If no room can be made the fact stays on the host, most recently used; the moves
        made meanwhile may have filled the host tier, which then drops its least
        recently used facts (never ``key``) to stay within its budget.

        Raises:
            KeyError: ``key`` is not on the host tier.
        """
        entry = self.host.pop(key, None)
        if entry is None:
            raise KeyError(f"fact {key} is not on the host tier")
        self._count_on_host(-entry.length)
        room = self._make_room(entry.length)
        moves = list(room.moves)
        if room.fits:
            self._add_to_device(key, entry)
            self.promotions += 1
            moves.append((PROMOTE, key))
        else:
            self.host[key] = entry
            self._count_on_host(entry.length)
            while self.host_tokens > (self.host_budget_tokens or 0) and len(self.host) > 1:
                moves.append(self._evict_host_lru())
        return Room(room.fits, tuple(moves))

    # -- helpers -----------------------------------------------------------------------

    def _make_room(self, tokens: int) -> Room:
        """Demote (or evict) least recently used facts until ``tokens`` more fit the
        device budget. If they cannot fit even with every movable fact gone (shared
        headers, pinned facts and captures in flight stay), nothing is moved."""
        if self.budget_tokens is None:
            return Room(True)
        excess = self.device_tokens + self._reserved + self._held + tokens - self.budget_tokens
        movable = self.device_tokens - self._shared_tokens - self._pinned_tokens
        if excess > movable:
            return Room(False)  # moving every movable fact would not do: none is moved
        moves: list[Move] = []
        for key in self._coldest_movable(excess):
            moves.extend(self._demote_or_evict(key))
        return Room(True, tuple(moves))

    def _coldest_movable(self, tokens: int) -> list[FactKey]:
        """The least recently used movable facts that add up to ``tokens`` or more. The
        walk from the cold end passes over only the unmovable facts colder than them:
        shared headers (one per layout) and this step's pins."""
        victims: list[FactKey] = []
        total = 0
        if tokens <= 0:
            return victims
        for key, entry in self.device.items():
            if self._is_movable(key):
                victims.append(key)
                total += entry.length
                if total >= tokens:
                    break
        return victims

    def _is_movable(self, key: FactKey) -> bool:
        return key.ns != SHARED_NS and key not in self._pinned

    def _unmovable_length(self, key: FactKey) -> int:
        """The device tokens that pinning ``key`` takes out of reach of eviction (none if
        it is not on the device, or is a header, which is never movable anyway)."""
        entry = self.device.get(key)
        return entry.length if entry is not None and key.ns != SHARED_NS else 0

    def _demote_or_evict(self, key: FactKey) -> list[Move]:
        """Move a fact off the device: to the host tier, whose least recently used facts
        make room for it, or out if there is no host tier or the fact is larger than it."""
        entry = self._remove_from_device(key)
        assert entry is not None
        budget = self.host_budget_tokens
        if budget is None or entry.length > budget:
            self.evictions += 1
            return [(EVICT, key)]
        moves = []
        while self.host_tokens + entry.length > budget:
            moves.append(self._evict_host_lru())
        self.host[key] = entry
        self._count_on_host(entry.length)
        self.demotions += 1
        moves.append((DEMOTE, key))
        return moves

    def _evict_host_lru(self) -> Move:
        key, entry = self.host.popitem(last=False)
        self._count_on_host(-entry.length)
        self.evictions += 1
        return (EVICT, key)

    def _add_to_device(self, key: FactKey, entry: Registered) -> None:
        """Put ``key`` on the device, most recently used (it is on neither tier)."""
        self.device[key] = entry
        self._count_on_device(key, entry.length)

    def _remove_from_device(self, key: FactKey) -> Registered | None:
        entry = self.device.pop(key, None)
        if entry is not None:
            self._count_on_device(key, -entry.length)
        return entry

    def _count_on_device(self, key: FactKey, tokens: int) -> None:
        """Keep the device totals right when ``tokens`` of ``key`` arrive (or leave,
        negative): every change of the device tier goes through here."""
        self.version += 1
        self.device_tokens += tokens
        if key.ns == SHARED_NS:
            self._shared_tokens += tokens
        elif key in self._pinned:
            self._pinned_tokens += tokens

    def _count_on_host(self, tokens: int) -> None:
        """Keep the host total right when ``tokens`` arrive (or leave, negative): every
        change of the host tier goes through here."""
        self.version += 1
        self.host_tokens += tokens

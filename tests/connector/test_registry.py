"""The fact registry on its own: tiers, budgets, least-recently-used moves, pins.

No engine and no vLLM: the registry is plain bookkeeping, tested like nano-vllm's block
manager. Budgets are token rows.
"""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_memory.connector.params import SHARED_NS, FactKey
from inferscale_memory.connector.plan import DEMOTE, EVICT, PROMOTE
from inferscale_memory.connector.registry import FactRegistry, Registered, Room

HEADER = FactKey(SHARED_NS, "header:L1")
A, B, C, D = (FactKey("alice", name) for name in "abcd")


def fact(length: int) -> Registered:
    return Registered(b"digest", length)


def registry(budget: int | None, host: int | None = None,
             facts: tuple[tuple[FactKey, int], ...] = ()) -> FactRegistry:
    """A registry holding ``facts`` on the device, the first least recently used."""
    reg = FactRegistry(budget, host)
    for key, length in facts:
        reg.register(key, fact(length))
    return reg


# -- registering and forgetting -----------------------------------------------------------


def test_register_and_forget_keep_the_token_count() -> None:
    reg = registry(None, facts=((A, 5), (B, 7)))
    assert list(reg.device) == [A, B] and reg.device_tokens == 12
    reg.register(A, fact(3))  # recaptured shorter: replaced, most recently used
    assert list(reg.device) == [B, A] and reg.device_tokens == 10
    reg.forget(B)
    reg.forget(C)  # unknown: nothing to do
    assert list(reg.device) == [A] and reg.device_tokens == 3
    assert reg.get(A) == fact(3) and reg.get(B) is None


def test_registering_a_demoted_fact_replaces_its_host_copy() -> None:
    reg = registry(10, host=20, facts=((A, 6),))
    reg.reserve(6)  # A goes to the host
    assert reg.is_on_host(A)
    reg.register(A, fact(4))
    assert not reg.is_on_host(A) and reg.host_tokens == 0
    assert reg.device_tokens == 4


def test_forget_drops_both_tiers() -> None:
    reg = registry(10, host=20, facts=((A, 6), (B, 4)))
    reg.reserve(6)  # A demoted
    reg.forget(A)
    reg.forget(B)
    assert not reg.device and not reg.host
    assert reg.device_tokens == 0 and reg.host_tokens == 0


def test_get_leaves_recency_alone_and_touch_refreshes_it() -> None:
    reg = registry(None, facts=((A, 1), (B, 1), (C, 1)))
    reg.get(A)
    assert list(reg.device) == [A, B, C]
    reg.touch(A)
    reg.touch(D)  # not registered: nothing to do
    assert list(reg.device) == [B, C, A]


# -- making room on the device -------------------------------------------------------------


def test_room_is_made_by_evicting_least_recently_used_facts() -> None:
    reg = registry(20, facts=((A, 8), (B, 8), (C, 4)))
    reg.touch(A)  # B is now the least recently used
    room = reg.reserve(8)
    assert room == Room(True, ((EVICT, B),))
    assert list(reg.device) == [C, A] and reg.device_tokens == 12
    assert reg.evictions == 1


def test_evictions_stop_as_soon_as_the_tokens_fit() -> None:
    reg = registry(20, facts=((A, 5), (B, 5), (C, 5), (D, 5)))
    assert reg.reserve(9).moves == ((EVICT, A), (EVICT, B))
    assert list(reg.device) == [C, D]


def test_without_a_budget_everything_fits_and_nothing_moves() -> None:
    reg = registry(None, facts=((A, 1000),))
    assert reg.reserve(10**6) == Room(True)
    assert list(reg.device) == [A]


def test_reserved_captures_count_until_released() -> None:
    reg = registry(20)
    assert reg.reserve(12).fits
    assert not reg.reserve(12).fits  # 12 in flight + 12 > 20, and nothing to evict
    reg.release(12)
    reg.register(A, fact(12))  # the capture's request finished
    assert reg.reserve(12).moves == ((EVICT, A),)


def test_the_shared_header_is_never_moved() -> None:
    reg = registry(20, host=100, facts=((HEADER, 8), (A, 8)))
    room = reg.reserve(12)
    assert room == Room(True, ((DEMOTE, A),))
    assert list(reg.device) == [HEADER]
    reg.release(12)
    assert not reg.reserve(13).fits
    assert list(reg.device) == [HEADER]


def test_pinned_facts_stay_until_the_step_ends() -> None:
    reg = registry(20, facts=((A, 8), (B, 8)))
    reg.pin([A])
    assert reg.reserve(8).moves == ((EVICT, B),)  # A is older, but a load reads it
    reg.release(8)
    reg.pin([A])
    assert reg.reserve(16) == Room(False)  # only A is left, and it is pinned
    reg.end_step()
    assert reg.reserve(16) == Room(True, ((EVICT, A),))


def test_room_that_cannot_be_made_reserves_nothing() -> None:
    reg = registry(20, facts=((HEADER, 8),))
    room = reg.reserve(13)
    assert room == Room(False)
    assert reg.reserve(12).fits  # nothing of the refused 13 was counted


def test_a_refusal_moves_no_fact() -> None:
    # Evicting A would not make room for 13 tokens beside the header: A stays.
    reg = registry(20, facts=((HEADER, 8), (A, 4)))
    assert reg.reserve(13) == Room(False)
    assert list(reg.device) == [HEADER, A] and reg.device_tokens == 12
    assert reg.evictions == 0 and reg.reserve(8) == Room(True)


def test_a_deleted_fact_read_in_the_step_keeps_its_tokens_until_the_step_ends() -> None:
    # The workers drop it after the step's loads, but replay the moves before them.
    reg = registry(20, facts=((A, 10), (B, 10)))
    reg.pin([A])
    reg.delete(A)
    assert reg.get(A) is None and reg.device_tokens == 10
    assert reg.reserve(10).moves == ((EVICT, B),)  # A's 10 rows are still taken
    reg.release(10)
    reg.end_step()
    assert reg.reserve(10) == Room(True)


def test_a_deleted_fact_no_load_reads_frees_its_tokens_at_once() -> None:
    reg = registry(20, facts=((A, 10), (B, 10)))
    reg.delete(A)
    assert reg.reserve(10) == Room(True)


# -- the host tier -------------------------------------------------------------------------


def test_room_is_made_by_demoting_to_the_host_tier() -> None:
    reg = registry(20, host=30, facts=((A, 10), (B, 10)))
    assert reg.reserve(10).moves == ((DEMOTE, A),)
    assert list(reg.device) == [B] and list(reg.host) == [A]
    assert reg.device_tokens == 10 and reg.host_tokens == 10
    assert reg.get(A) == fact(10)  # still registered: requests may claim it
    assert reg.demotions == 1 and reg.evictions == 0


def test_the_host_tier_drops_its_least_recently_used_facts() -> None:
    reg = registry(10, host=10, facts=((A, 6),))
    reg.reserve(10)  # A demoted
    reg.release(10)
    reg.register(B, fact(6))
    assert reg.reserve(10).moves == ((EVICT, A), (DEMOTE, B))
    assert list(reg.host) == [B] and reg.host_tokens == 6
    assert reg.get(A) is None and reg.evictions == 1


def test_a_fact_larger_than_the_host_tier_is_evicted() -> None:
    reg = registry(10, host=5, facts=((A, 6),))
    assert reg.reserve(10).moves == ((EVICT, A),)
    assert not reg.host


def test_promotion_brings_a_fact_back_and_demotes_another() -> None:
    reg = registry(20, host=30, facts=((A, 10), (B, 10)))
    reg.reserve(10)  # A demoted; a capture of 10 is in flight
    reg.pin([A])
    room = reg.promote(A)
    assert room == Room(True, ((DEMOTE, B), (PROMOTE, A)))
    assert list(reg.device) == [A] and list(reg.host) == [B]
    assert reg.device_tokens == 10 and reg.host_tokens == 10
    assert reg.promotions == 1


def test_a_promotion_that_finds_no_room_stays_on_the_host_within_its_budget() -> None:
    reg = registry(20, host=10, facts=((A, 10), (B, 8), (C, 2)))
    reg.reserve(10)  # A demoted (the host tier is full); a capture of 10 is in flight
    reg.pin([A, B])
    room = reg.promote(A)  # demoting C would not do: B (pinned) leaves too little room
    assert room == Room(False)  # so C stays on the device
    assert list(reg.host) == [A] and reg.host_tokens == 10
    assert list(reg.device) == [B, C] and reg.promotions == 0 and reg.demotions == 1


def test_host_facts_are_never_victims_of_device_room() -> None:
    reg = registry(10, host=30, facts=((A, 10),))
    reg.reserve(10)  # A demoted
    assert reg.reserve(1) == Room(False)  # the 10 reserved fill the device
    assert list(reg.host) == [A]


# -- impossible requests -------------------------------------------------------------------


def test_promoting_a_fact_not_on_the_host_tier_is_an_error() -> None:
    reg = registry(20, host=20, facts=((A, 5),))
    with pytest.raises(KeyError, match="not on the host tier"):
        reg.promote(A)
    with pytest.raises(KeyError, match="not on the host tier"):
        reg.promote(B)
    assert list(reg.device) == [A] and reg.device_tokens == 5


def test_reserving_or_releasing_impossible_amounts_is_an_error() -> None:
    reg = registry(20)
    with pytest.raises(ValueError, match="reserve"):
        reg.reserve(-1)
    reg.reserve(5)
    with pytest.raises(ValueError, match="5 reserved"):
        reg.release(6)
    with pytest.raises(ValueError, match="release"):
        reg.release(-1)
    reg.release(5)


# -- invariants under any sequence of changes -----------------------------------------------

KEYS = [HEADER, A, B, C, D]
OPS = st.lists(st.tuples(st.sampled_from(["register", "forget", "delete", "touch", "pin",
                                          "reserve", "release", "promote", "end_step"]),
                         st.sampled_from(KEYS), st.integers(1, 12)), max_size=40)


def apply_op(reg: FactRegistry, op: str, key: FactKey, length: int, reserved: int) -> int:
    """Apply one generated change other than ``register``; returns the tokens reserved."""
    if op == "reserve":
        return reserved + (length if reg.reserve(length).fits else 0)
    if op == "release":
        reg.release(min(length, reserved))
        return reserved - min(length, reserved)
    if op == "promote" and reg.is_on_host(key):
        reg.promote(key)
    elif op in ("forget", "delete", "touch"):
        getattr(reg, op)(key)
    elif op == "pin":
        reg.pin([key])
    elif op == "end_step":
        reg.end_step()
    return reserved


@settings(max_examples=300, deadline=None)
@given(ops=OPS, budget=st.integers(8, 30), host=st.one_of(st.none(), st.integers(1, 30)))
def test_tiers_stay_within_their_budgets_and_counts_add_up(
        ops: list[tuple[str, FactKey, int]], budget: int, host: int | None) -> None:
    reg = FactRegistry(budget, host)
    reserved = 0
    pinned: set[FactKey] = set()
    for op, key, length in ops:
        pinned_on_device = pinned & set(reg.device)
        if op == "register" and length <= budget - reg.device_tokens - reserved:
            reg.register(key, fact(length))  # a capture that fitted, as the scheduler's do
        elif op != "register":
            reserved = apply_op(reg, op, key, length, reserved)
        if op == "pin":
            pinned.add(key)
        elif op == "end_step":
            pinned.clear()
        if op not in ("forget", "delete", "register"):
            assert pinned_on_device <= set(reg.device)  # no move took a pinned fact away
        assert reg.device_tokens == sum(e.length for e in reg.device.values())
        assert reg.host_tokens == sum(e.length for e in reg.host.values())
        assert reg.device_tokens + reserved <= budget
        assert reg.host_tokens <= (host or 0)
        assert not set(reg.device) & set(reg.host)
        assert HEADER not in reg.host


def test_the_registry_imports_neither_vllm_nor_torch() -> None:
    code = ("import sys, inferscale_memory.connector.registry; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# -- work per capture -------------------------------------------------------------------------


class CountingDict(OrderedDict[FactKey, Registered]):
    """An OrderedDict that counts the entries read through it (iteration and lookups);
    popping, moving and inserting are the moves themselves and are not counted."""

    reads = 0

    def __iter__(self) -> Iterator[FactKey]:
        for key in super().__iter__():
            self.reads += 1
            yield key

    def keys(self) -> Iterator[FactKey]:  # type: ignore[override]
        return iter(self)

    def items(self) -> Iterator[tuple[FactKey, Registered]]:  # type: ignore[override]
        return ((key, OrderedDict.__getitem__(self, key)) for key in self)

    def values(self) -> Iterator[Registered]:  # type: ignore[override]
        return (OrderedDict.__getitem__(self, key) for key in self)

    def __getitem__(self, key: FactKey) -> Registered:
        self.reads += 1
        return super().__getitem__(key)


def entries_read_per_capture(num_facts: int, host: int | None) -> list[int]:
    """Entries of the device tier read by each of 20 captures, each of which must move
    exactly the one least recently used fact, with ``num_facts`` facts held."""
    keys = [FactKey("alice", f"f{i}") for i in range(num_facts)]
    reg = registry(num_facts * 4 + 8, host, facts=((HEADER, 8), *((k, 4) for k in keys)))
    reg.device = counting = CountingDict(reg.device)
    reads = []
    for i in range(20):
        reg.pin([keys[-1]])  # a load of this step: pinned, warm, never visited
        before = counting.reads
        room = reg.reserve(4)
        reads.append(counting.reads - before)
        assert room.fits and room.moves[-1][1] == keys[i]  # the coldest fact, no other
        assert len(room.moves) == (1 if host is None or i < host // 4 else 2)
        reg.release(4)
        reg.register(FactKey("alice", f"new{i}"), fact(4))
        reg.end_step()
    return reads


@pytest.mark.parametrize("host", [None, 40])
def test_making_room_reads_only_the_facts_it_moves(host: int | None) -> None:
    # The scheduler makes room on every capture: its work must not grow with the facts
    # held (listing 100,000 facts per capture stalled the engine's scheduler for 51 ms).
    held_few, held_many = (entries_read_per_capture(n, host) for n in (1_000, 100_000))
    assert held_many == held_few
    assert max(held_many) <= 2  # the header colder than the victim, and the victim


class FullScanRegistry(FactRegistry):
    """The policy as first written: list every movable fact, then move the coldest."""

    def _make_room(self, tokens: int) -> Room:
        if self.budget_tokens is None:
            return Room(True)
        victims = [key for key in self.device if self._is_movable(key)]
        excess = self.device_tokens + self._reserved + self._held + tokens - self.budget_tokens
        if excess > sum(self.device[key].length for key in victims):
            return Room(False)
        moves: list[tuple[str, FactKey]] = []
        for key in victims:
            if excess <= 0:
                break
            excess -= self.device[key].length
            moves.extend(self._demote_or_evict(key))
        return Room(True, tuple(moves))


@settings(max_examples=300, deadline=None)
@given(ops=OPS, budget=st.integers(8, 30), host=st.one_of(st.none(), st.integers(1, 30)))
def test_the_moves_are_those_of_the_full_scan(
        ops: list[tuple[str, FactKey, int]], budget: int, host: int | None) -> None:
    # The workers replay the moves: keeping running totals must not change a single one.
    fast, scan = FactRegistry(budget, host), FullScanRegistry(budget, host)
    reserved = 0
    for op, key, length in ops:
        if op == "release":
            length = min(length, reserved)
        elif op == "promote" and not fast.is_on_host(key):
            continue
        args = {"register": (key, fact(length)), "forget": (key,), "delete": (key,),
                "touch": (key,), "pin": ([key],), "reserve": (length,),
                "release": (length,), "promote": (key,), "end_step": ()}[op]
        outcome = getattr(fast, op)(*args)
        assert outcome == getattr(scan, op)(*args)
        if op in ("reserve", "release"):
            reserved += (length if outcome.fits else 0) if op == "reserve" else -length
        assert list(fast.device.items()) == list(scan.device.items())
        assert list(fast.host.items()) == list(scan.host.items())
        assert (fast.device_tokens, fast.host_tokens) == (scan.device_tokens, scan.host_tokens)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, budget=st.integers(8, 30), host=st.one_of(st.none(), st.integers(1, 30)))
def test_an_unchanged_version_means_unchanged_registrations(
        ops: list[tuple[str, FactKey, int]], budget: int, host: int | None) -> None:
    # The scheduler keeps a request's match until the version changes.
    reg = FactRegistry(budget, host)
    reserved = 0
    for op, key, length in ops:
        before = (reg.version, [reg.get(k) for k in KEYS])
        if op == "register":
            reg.register(key, Registered(bytes([length]), length))
        else:
            reserved = apply_op(reg, op, key, length, reserved)
        if reg.version == before[0]:
            assert [reg.get(k) for k in KEYS] == before[1]



def test_forgetting_a_demoted_fact_changes_the_version() -> None:
    reg = registry(10, host=20, facts=((A, 6),))
    reg.reserve(10)  # A demoted
    version = reg.version
    reg.forget(A)  # the host tier alone changes
    assert reg.version > version

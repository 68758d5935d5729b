"""What the connector's scheduler side follows of each vLLM request (plain data, no torch).

A request is tracked from its first match to its end (:class:`Tracked`): its parsed
parameters, the injection matched for it (:class:`InjectionPlan`), its captures
(:class:`CaptureTrack`), the pool moves made on its behalf (:class:`Moves`) and what its
finished report will say (:class:`Report`, sent as a
:class:`~.report.ConnectorReport`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferscale_memory.connector.params import FactKey, RequestParams, Span
from inferscale_memory.connector.plan import DEMOTE, EVICT, PROMOTE
from inferscale_memory.connector.registry import Move


@dataclass(frozen=True)
class InjectionPlan:
    """The outcome of matching a request's inject spans against the registry."""

    usable: tuple[Span, ...]  # spans whose KV can be loaded, contiguous from position 0
    missing: tuple[Span, ...]  # named spans that will be recomputed instead
    claim_end: int  # first position that vLLM computes itself

    def claim(self, num_computed: int) -> int:
        return max(0, self.claim_end - num_computed)


@dataclass
class Moves:
    """Pool moves made on behalf of one request (for its report)."""

    evicted: list[FactKey] = field(default_factory=list)  # dropped to make room
    demoted: list[FactKey] = field(default_factory=list)  # moved to the host tier
    promoted: list[FactKey] = field(default_factory=list)  # back from the host tier
    deleted: list[FactKey] = field(default_factory=list)  # held, dropped by the request

    def add(self, moves: tuple[Move, ...]) -> None:
        lists = {EVICT: self.evicted, DEMOTE: self.demoted, PROMOTE: self.promoted}
        for move, key in moves:
            lists[move].append(key)

    def any(self) -> bool:
        return bool(self.evicted or self.demoted or self.promoted or self.deleted)


@dataclass
class CaptureTrack:
    """A request's capture spans, its cache blocks, and the spans already sent to the
    workers (a long prompt is prefilled over several steps)."""

    spans: list[Span]  # not yet sent to the workers, in prompt order
    block_ids: list[int]
    emitted: list[Span] = field(default_factory=list)


@dataclass
class Report:
    """What a request's finished report says of its injection."""

    injected_tokens: int = 0
    missing: list[FactKey] = field(default_factory=list)
    error: str | None = None


@dataclass
class Tracked:
    """What the scheduler side follows of one request, from its first match to its end."""

    params: RequestParams | None  # None: served as a plain prompt
    error: str | None = None  # why its params were refused or cut, for its report
    plan: InjectionPlan | None = None  # its latest match, which its allocation claims
    # vLLM's prefix cache held every inject span when last asked: nothing was matched.
    cached: bool = False
    matched_at: int = -1  # the registry's version when ``plan`` was matched
    # token_digest of the prompt under each inject span (by index), computed once: the
    # prompt never changes, and vLLM may ask for a match on every step it waits.
    digests: dict[int, bytes] = field(default_factory=dict)
    report: Report | None = None  # from its first scheduling on
    capture: CaptureTrack | None = None
    # (key, tokens, cache blocks) of every piece of KV sent to the workers for it.
    loaded: list[tuple[FactKey, int, frozenset[int]]] = field(default_factory=list)
    moves: Moves = field(default_factory=Moves)  # made on its behalf

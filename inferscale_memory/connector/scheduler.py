"""Scheduler side of the connector: which facts exist, what each request may claim.

Plain bookkeeping, no torch. The scheduler process never shares memory with the driver
or the workers, so it learns which facts exist only from the requests it schedules: a
fact is registered when the request that captured it finishes, and dropped when an
eviction request is scheduled. Every span a request wants injected is checked against
the registry *and* against the request's own prompt tokens (a digest), so a forged or
stale span is recomputed, never loaded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferscale_memory.connector.params import (
    PARAMS_KEY,
    SHARED_NS,
    FactKey,
    ParamsError,
    RequestParams,
    Span,
    cache_salt,
    parse_params,
    token_digest,
)
from inferscale_memory.connector.plan import (
    DEMOTE,
    EVICT,
    PROMOTE,
    CaptureOp,
    LoadOp,
    StepPlan,
    blocks_of,
)

logger = logging.getLogger(__name__)


class RequestLike(Protocol):
    """The fields of vLLM's ``Request`` that the scheduler side reads."""

    request_id: str
    prompt_token_ids: list[int] | None
    kv_transfer_params: dict[str, Any] | None
    cache_salt: str | None


@dataclass(frozen=True)
class Registered:
    """What the scheduler knows of a captured fact."""

    digest: bytes  # token_digest of the captured tokens
    length: int  # number of tokens


@dataclass(frozen=True)
class InjectionPlan:
    """The outcome of matching a request's inject spans against the registry."""

    usable: tuple[Span, ...]  # spans whose KV can be loaded, contiguous from position 0
    missing: tuple[Span, ...]  # named spans that will be recomputed instead
    claim_end: int  # first position that vLLM computes itself

    def claim(self, num_computed: int) -> int:
        return max(0, self.claim_end - num_computed)


@dataclass
class _Moves:
    """Pool moves made on behalf of one request (for its report)."""

    evicted: list[FactKey] = field(default_factory=list)  # dropped to make room
    demoted: list[FactKey] = field(default_factory=list)  # moved to the host tier
    promoted: list[FactKey] = field(default_factory=list)  # back from the host tier

    def body(self) -> dict[str, list[list[str]]]:
        return {name: [[key.ns, key.name] for key in keys]
                for name, keys in (("evicted", self.evicted), ("demoted", self.demoted),
                                   ("promoted", self.promoted)) if keys}


@dataclass
class _CaptureTrack:
    spans: list[Span]
    block_ids: list[int]
    emitted: list[Span] = field(default_factory=list)


@dataclass
class _Report:
    injected_tokens: int = 0
    missing: list[list[str]] = field(default_factory=list)
    error: str | None = None


class SchedulerSide:
    """Registry of captured facts and the per-step plan for the workers.

    With a ``budget_tokens``, the registry is also the pool's eviction policy: before a
    step captures a span, room for it is made by evicting the least recently injected or
    captured facts (never a shared header, never a fact loaded in the same step) on every
    worker, in the same step; a span that cannot fit even then is not captured. The
    workers' pools thus hold what the registry holds, within the budget, so a request
    naming an evicted fact is told it is missing (and recomputes it) instead of failing a
    load.

    With a ``host_budget_tokens`` as well, room is made by *demoting* facts to the
    workers' host-memory tier (itself least recently used first, within its budget); a
    request naming a demoted fact promotes it back to the device before its load, which
    costs one copy instead of a recompute.
    """

    def __init__(self, budget_tokens: int | None = None,
                 host_budget_tokens: int | None = None, block_size: int = 16) -> None:
        self.registry: OrderedDict[FactKey, Registered] = OrderedDict()  # LRU first
        self.host: OrderedDict[FactKey, Registered] = OrderedDict()  # demoted, LRU first
        self.budget_tokens = budget_tokens
        self.host_budget_tokens = host_budget_tokens or None
        self.registered_tokens = 0
        self.host_tokens = 0
        self.evictions = 0
        self.demotions = 0
        self.promotions = 0
        self._reserved = 0  # tokens of captures emitted to the workers, not yet registered
        self._pinned: set[FactKey] = set()  # facts loaded in the step being planned
        self._held = 0  # tokens of facts deleted in this step that a load of it reads
        self._moves: dict[str, _Moves] = {}  # by request
        self.block_size = block_size
        # Per request: (key, tokens, cache blocks) of every piece sent to the workers.
        self._loaded: dict[str, list[tuple[FactKey, int, frozenset[int]]]] = {}
        self.load_failures = 0
        self._params: dict[str, RequestParams | None] = {}
        self._errors: dict[str, str] = {}
        self._captures: dict[str, _CaptureTrack] = {}
        self._reports: dict[str, _Report] = {}
        self._plans: dict[str, InjectionPlan] = {}  # matched, not yet allocated
        # The request whose capture of a key the workers' pool holds last (see finished).
        self._capturer: dict[FactKey, str] = {}
        self._next = StepPlan()

    # -- called by vLLM's scheduler, through the connector shim ------------------------

    def num_matched_tokens(self, request: RequestLike, num_computed: int) -> int:
        """Tokens after ``num_computed`` whose KV the workers can load. No side effects
        beyond memoising the parsed params."""
        params = self._request_params(request)
        if params is None or not params.inject:
            return 0
        plan = self._plans[request.request_id] = self._plan_injection(request, params)
        return plan.claim(num_computed)

    def after_alloc(self, request: RequestLike, block_ids: list[int], num_external: int) -> None:
        """Record the load, capture and evict work of a request that was just scheduled."""
        params = self._request_params(request)
        req_id = request.request_id
        report = self._reports.setdefault(req_id, _Report(error=self._errors.get(req_id)))
        if params is None:
            return
        if params.inject:
            # As matched just before in the same scheduling pass (the registry only
            # changes between steps).
            plan = self._plans.pop(req_id, None) or self._plan_injection(request, params)
            report.missing = [[s.key.ns, s.key.name] for s in plan.missing]
            report.injected_tokens = num_external
            if num_external > 0:
                op = self._load_op(req_id, block_ids, plan, num_external)
                loaded = [key for key, *_ in op.pieces]
                self._pinned.update(loaded)
                for key in loaded:
                    if key in self.host:
                        self._promote(req_id, key)
                self._next.loads.append(op)
                self._loaded[req_id] = [
                    (key, length, frozenset(
                        blocks_of(op.block_ids, self.block_size, position, length)))
                    for key, _, length, position in op.pieces]
            for span in plan.usable:
                if span.key in self.registry:
                    self.registry.move_to_end(span.key)  # recently used
        if params.capture:
            self._track_capture(request, params, block_ids)
        for key in params.evict:
            if key in self._pinned and key in self.registry:
                self._held += self.registry[key].length  # freed after the loads
            self._forget(key)
            self._capturer.pop(key, None)
            self._next.evicts.append(key)

    def build_plan(self, new_reqs: list[Any], cached_reqs: Any,
                   num_scheduled: dict[str, int]) -> StepPlan:
        """The worker plan of this step; resets the pending loads and evictions."""
        plan, self._next = self._next, StepPlan()
        for req in new_reqs:
            track = self._captures.get(req.req_id)
            if track is not None:
                end = req.num_computed_tokens + num_scheduled.get(req.req_id, 0)
                self._emit_captures(req.req_id, track, end, plan)
        for i, req_id in enumerate(cached_reqs.req_ids):
            track = self._captures.get(req_id)
            if track is None:
                continue
            new_blocks = cached_reqs.new_block_ids[i]
            if new_blocks is not None:
                if req_id in cached_reqs.resumed_req_ids:
                    track.block_ids = list(new_blocks[0])
                else:
                    track.block_ids.extend(new_blocks[0])
            end = cached_reqs.num_computed_tokens[i] + num_scheduled.get(req_id, 0)
            self._emit_captures(req_id, track, end, plan)
        self._pinned.clear()
        self._held = 0
        return plan

    def load_failed(self, block_ids: set[int]) -> None:
        """Workers failed to load these cache blocks (vLLM recomputes them): forget the
        facts loaded there, so that later requests do not claim them again, and report
        them missing, so that the engine recaptures them. The shared header stays (it is
        never recaptured; its rows are never dropped)."""
        for req_id, pieces in self._loaded.items():
            failed = [(key, length) for key, length, blocks in pieces
                      if not blocks.isdisjoint(block_ids)]
            if not failed:
                continue
            report = self._reports.get(req_id)
            for key, length in failed:
                if report is not None:
                    report.injected_tokens -= length
                if key.ns == SHARED_NS:
                    continue
                logger.warning("request %s: fact %s failed to load; recomputed, forgotten",
                               req_id, key)
                self.load_failures += 1
                self._forget(key)
                self._next.evicts.append(key)
                if report is not None and [key.ns, key.name] not in report.missing:
                    report.missing.append([key.ns, key.name])
            self._loaded[req_id] = [p for p in pieces if (p[0], p[1]) not in failed]

    def finished(self, request: RequestLike) -> dict[str, Any] | None:
        """Register the facts a capture request stored; return the request's report."""
        req_id = request.request_id
        track = self._captures.pop(req_id, None)
        prompt = request.prompt_token_ids or []
        captured = []
        latest = {span.key: span for span in track.emitted} if track else {}
        self._reserved -= sum(span.length for span in track.emitted) if track else 0
        for key, span in latest.items():
            if self._capturer.get(key) != req_id:
                continue  # captured again by a later request, or evicted, since
            del self._capturer[key]
            tokens = prompt[span.start:span.end]
            self._register(key, Registered(token_digest(tokens), len(tokens)))
            captured.append([key.ns, key.name])
        moves = self._moves.pop(req_id, None)
        self._loaded.pop(req_id, None)
        self._params.pop(req_id, None)
        self._plans.pop(req_id, None)
        self._errors.pop(req_id, None)
        report = self._reports.pop(req_id, None)
        if report is None and not captured:
            return None
        body: dict[str, Any] = {"captured": captured}
        if moves is not None:
            body.update(moves.body())
        if (captured or moves) and self.budget_tokens is not None:
            body.update(pool_tokens=self.registered_tokens, budget_tokens=self.budget_tokens)
            if self.host_budget_tokens is not None:
                body.update(host_tokens=self.host_tokens,
                            host_budget_tokens=self.host_budget_tokens)
        if report is not None:
            body.update(injected_tokens=report.injected_tokens, missing=report.missing)
            if report.error:
                body["error"] = report.error
        return {PARAMS_KEY: body}

    # -- helpers -----------------------------------------------------------------------

    def _register(self, key: FactKey, entry: Registered) -> None:
        self._forget(key)
        self.registry[key] = entry
        self.registered_tokens += entry.length

    def _unregister(self, key: FactKey) -> Registered | None:
        entry = self.registry.pop(key, None)
        if entry is not None:
            self.registered_tokens -= entry.length
        return entry

    def _forget(self, key: FactKey) -> None:
        """Drop ``key`` from both tiers (the workers drop both with it)."""
        self._unregister(key)
        entry = self.host.pop(key, None)
        if entry is not None:
            self.host_tokens -= entry.length

    def _make_room(self, tokens: int, req_id: str, plan: StepPlan) -> bool:
        """Demote (or evict) least recently used facts until ``tokens`` more fit the
        budget; ``False`` if they cannot fit (only shared headers, facts loaded in this
        step and in-flight captures are left)."""
        if self.budget_tokens is None:
            return True
        victims = (key for key in list(self.registry)
                   if key.ns != SHARED_NS and key not in self._pinned)
        while (self.registered_tokens + self._reserved + self._held + tokens
               > self.budget_tokens):
            key = next(victims, None)
            if key is None:
                return False
            entry = self._unregister(key)
            assert entry is not None
            moves = self._moves.setdefault(req_id, _Moves())
            if self._demote(key, entry, req_id, plan):
                moves.demoted.append(key)
            else:
                plan.moves.append((EVICT, key))
                moves.evicted.append(key)
                self.evictions += 1
        return True

    def _demote(self, key: FactKey, entry: Registered, req_id: str, plan: StepPlan) -> bool:
        """Move a fact to the host tier, dropping that tier's least recently used facts
        to make room; ``False`` if there is no host tier or the fact is larger than it."""
        budget = self.host_budget_tokens
        if budget is None or entry.length > budget:
            return False
        while self.host_tokens + entry.length > budget:
            self._evict_host_lru(req_id, plan)
        self.host[key] = entry
        self.host_tokens += entry.length
        plan.moves.append((DEMOTE, key))
        self.demotions += 1
        return True

    def _evict_host_lru(self, req_id: str, plan: StepPlan) -> None:
        """Drop the host tier's least recently used fact on every worker."""
        old, dropped = self.host.popitem(last=False)
        self.host_tokens -= dropped.length
        plan.moves.append((EVICT, old))
        self._moves.setdefault(req_id, _Moves()).evicted.append(old)
        self.evictions += 1

    def _promote(self, req_id: str, key: FactKey) -> None:
        """Bring a demoted fact back to the device for a load in this step. If no room
        can be made the fact stays on the host; the workers then miss it and vLLM
        recomputes its blocks (correct, only slower)."""
        entry = self.host.pop(key)
        self.host_tokens -= entry.length
        if not self._make_room(entry.length, req_id, self._next):
            logger.warning("no room to promote fact %s to the device", key)
            self.host[key] = entry
            self.host_tokens += entry.length
            # The facts demoted meanwhile may have filled the host tier: it drops its
            # least recently used ones (``key`` is the most recent).
            while self.host_tokens > (self.host_budget_tokens or 0) and len(self.host) > 1:
                self._evict_host_lru(req_id, self._next)
            return
        self.registry[key] = entry
        self.registered_tokens += entry.length
        self._next.moves.append((PROMOTE, key))
        self._moves.setdefault(req_id, _Moves()).promoted.append(key)
        self.promotions += 1

    def _request_params(self, request: RequestLike) -> RequestParams | None:
        req_id = request.request_id
        if req_id not in self._params:
            self._params[req_id] = self._parse(request)
        return self._params[req_id]

    def _parse(self, request: RequestLike) -> RequestParams | None:
        prompt_len = len(request.prompt_token_ids or [])
        try:
            params = parse_params(request.kv_transfer_params, prompt_len)
        except ParamsError as exc:
            # A bad request is served as a plain prompt; it must never stop the engine.
            logger.warning("request %s: ignoring kv_transfer_params: %s", request.request_id, exc)
            self._errors[request.request_id] = str(exc)
            return None
        if (params is not None and params.inject
                and request.cache_salt != cache_salt(params.tenant, params.layout)):
            message = "injection needs the cache_salt of its tenant and layout"
            logger.warning("request %s: %s", request.request_id, message)
            self._errors[request.request_id] = message
            params = RequestParams(params.tenant, params.layout, params.capture, (),
                                   params.evict)
        return params

    def _plan_injection(self, request: RequestLike, params: RequestParams) -> InjectionPlan:
        prompt = request.prompt_token_ids or []
        usable: list[Span] = []
        position = 0
        for span in params.inject:
            entry = self.registry.get(span.key) or self.host.get(span.key)
            if (span.start != position or entry is None or entry.length != span.length
                    or entry.digest != token_digest(prompt[span.start:span.end])):
                break
            usable.append(span)
            position = span.end
        missing = params.inject[len(usable):]
        # vLLM must compute at least the last prompt token itself.
        return InjectionPlan(tuple(usable), tuple(missing), min(position, len(prompt) - 1))

    @staticmethod
    def _load_op(req_id: str, block_ids: list[int], plan: InjectionPlan,
                 num_external: int) -> LoadOp:
        load_start, load_end = plan.claim_end - num_external, plan.claim_end
        pieces = []
        for span in plan.usable:
            start, end = max(span.start, load_start), min(span.end, load_end)
            if start < end:
                pieces.append((span.key, start - span.start, end - start, start))
        return LoadOp(req_id, list(block_ids), pieces)

    def _track_capture(self, request: RequestLike, params: RequestParams,
                       block_ids: list[int]) -> None:
        track = self._captures.get(request.request_id)
        if track is not None:  # rescheduled after a preemption: new blocks
            track.block_ids = list(block_ids)
            return
        prompt = request.prompt_token_ids or []
        wanted = [span for span in params.capture if not self._is_registered(span, prompt)]
        self._captures[request.request_id] = _CaptureTrack(wanted, list(block_ids))

    def _is_registered(self, span: Span, prompt: list[int]) -> bool:
        entry = self.registry.get(span.key) or self.host.get(span.key)
        tokens = prompt[span.start:span.end]
        return entry is not None and entry.digest == token_digest(tokens)

    def _emit_captures(self, req_id: str, track: _CaptureTrack, computed_end: int,
                       plan: StepPlan) -> None:
        ready = [s for s in track.spans if s.end <= computed_end]
        if not ready:
            return
        track.spans = [s for s in track.spans if s.end > computed_end]
        emitted = []
        for span in ready:
            # The workers overwrite this key's pool entry in this step, but with async
            # scheduling later steps are planned before this request finishes: the old
            # registration must not be claimed meanwhile.
            self._forget(span.key)
            if not self._make_room(span.length, req_id, plan):
                logger.warning("fact %s does not fit the KV pool budget; not captured",
                               span.key)
                plan.evicts.append(span.key)  # any older KV of it on the workers
                continue
            self._reserved += span.length
            self._capturer[span.key] = req_id
            emitted.append(span)
        if emitted:
            track.emitted.extend(emitted)
            plan.captures.append(CaptureOp(req_id, list(track.block_ids), emitted))

"""Scheduler side of the connector: what each request may claim, and each step's plan.

Plain bookkeeping, no torch and no vLLM: it reads vLLM's requests and steps as the plain
views of :mod:`.step`, which the driver (:mod:`inferscale_memory.driver.scheduling`) builds
from vLLM's records. Which facts exist, in which tier, within which budget, is the business
of :mod:`.registry`, and this module is the glue between the requests and it. The scheduler
process never shares memory with the driver or the workers, so it learns which facts exist
only from the requests it schedules: a fact is registered when the request that captured it
finishes, and dropped when an eviction request is scheduled. Every span a request wants
injected is checked against the registry *and* against the request's own prompt tokens (a
digest), so a forged or stale span is recomputed, never loaded.
"""

from __future__ import annotations

import logging
from array import array
from bisect import bisect_right
from collections.abc import Collection, Sequence

from inferscale_memory.connector.params import (
    SHARED_NS,
    FactKey,
    ParamsError,
    RequestParams,
    Span,
    cache_salt,
    parse_params,
    token_digest,
)
from inferscale_memory.connector.plan import CaptureOp, LoadOp, StepPlan, blocks_of
from inferscale_memory.connector.registry import FactRegistry, Move, Registered
from inferscale_memory.connector.report import ConnectorReport
from inferscale_memory.connector.step import RequestView, ScheduledRequest
from inferscale_memory.connector.tracking import CaptureTrack, InjectionPlan, Report, Tracked

logger = logging.getLogger(__name__)


class SchedulerSide:
    """The connector's scheduler side: requests and steps in (plain views), a plan per
    step out.

    Which facts exist, and which ones each tier keeps within its budget, is the
    :class:`~.registry.FactRegistry`'s business (the one eviction policy). This class
    follows vLLM's requests around it: it matches inject spans against the registry and
    the request's own tokens, pins what a step loads, reserves room for what it captures,
    registers captures when their request finishes, and forwards every move the registry
    makes to the workers in the step plan, so that their pools hold what it holds. A
    request naming a fact that was evicted is told it is missing (and recomputes it)
    instead of failing a load; one naming a demoted fact promotes it back to the device
    before its load, which costs one copy instead of a recompute.
    """

    def __init__(self, budget_tokens: int | None = None,
                 host_budget_tokens: int | None = None, block_size: int = 16) -> None:
        self.facts = FactRegistry(budget_tokens, host_budget_tokens)
        self.block_size = block_size
        self.load_failures = 0
        self._requests: dict[str, Tracked] = {}  # by request id, until it finishes
        # The request whose capture of a key the workers' pool holds last (see
        # _register_captures).
        self._capturer: dict[FactKey, str] = {}
        # The capture of each request with spans whose tokens are not all computed yet.
        self._capturing: dict[str, CaptureTrack] = {}
        self._next = StepPlan()

    # -- called by vLLM's scheduler, through the connector shim ------------------------

    def num_matched_tokens(self, request: RequestView, num_computed: int) -> int:
        """Tokens after ``num_computed`` whose KV the workers can load. vLLM asks on every
        step a request waits, so nothing is computed twice: no side effects beyond
        memoising the parsed params, the spans' digests and the match (until the
        registry changes)."""
        tracked = self._track(request)
        if tracked.params is None or not tracked.params.inject:
            return 0
        # vLLM's own prefix cache already holds every span (the same facts asked again):
        # nothing could be claimed, so nothing is parsed, hashed or looked up.
        last = min(tracked.params.inject[-1].end, len(request.prompt_token_ids) - 1)
        tracked.cached = num_computed >= last
        if tracked.cached:
            return 0
        return self._match(request, tracked).claim(num_computed)

    def after_alloc(self, request: RequestView, block_ids: list[int], num_external: int) -> None:
        """Record the load, capture and evict work of a request that was just scheduled."""
        tracked = self._track(request)
        params = tracked.params
        if tracked.report is None:
            tracked.report = Report(error=tracked.error)
        if params is None:
            return
        if params.inject:
            self._record_injection(request, tracked, block_ids, num_external)
        if params.capture:
            self._track_capture(request, tracked, params, block_ids)
        for key in params.evict:
            if self.facts.delete(key):  # reported with the pool's tokens after it
                tracked.moves.deleted.append(key)
            self._capturer.pop(key, None)
            self._next.evicts.append(key)

    @property
    def capturing(self) -> Collection[str]:
        """Ids of the requests whose capture waits for tokens: the only ones
        :meth:`build_plan` reads of a step."""
        return self._capturing.keys()

    def build_plan(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        """The worker plan of this step, in which ``scheduled`` (those of the step's
        requests that :attr:`capturing` names) compute their tokens; resets the pending
        loads and evictions."""
        plan, self._next = self._next, StepPlan()
        for req_id, num_computed, num_scheduled, new_block_ids, resumed in scheduled:
            track = self._capturing.get(req_id)
            if track is None:
                continue
            if new_block_ids is not None:
                if resumed:
                    track.block_ids = list(new_block_ids)
                else:
                    track.block_ids.extend(new_block_ids)
            self._emit_captures(req_id, track, num_computed + num_scheduled, plan)
        self.facts.end_step()
        return plan

    def load_failed(self, block_ids: set[int]) -> None:
        """Workers failed to load these cache blocks (vLLM recomputes them): forget the
        facts loaded there, so that later requests do not claim them again, and report
        them missing, so that the engine recaptures them. The shared header stays (it is
        never recaptured; its rows are never dropped)."""
        for req_id, tracked in self._requests.items():
            pieces = tracked.loaded
            failed = [(key, length) for key, length, blocks in pieces
                      if not blocks.isdisjoint(block_ids)]
            if not failed:
                continue
            report = tracked.report
            for key, length in failed:
                if report is not None:
                    report.injected_tokens -= length
                if key.ns == SHARED_NS:
                    continue
                logger.warning("request %s: fact %s failed to load; recomputed, forgotten",
                               req_id, key)
                self.load_failures += 1
                self.facts.forget(key)
                self._next.evicts.append(key)
                if report is not None and key not in report.missing:
                    report.missing.append(key)
            tracked.loaded = [p for p in pieces if (p[0], p[1]) not in failed]

    def finished(self, request: RequestView) -> ConnectorReport | None:
        """Register the facts a capture request stored; return the request's report
        (``None``: the request was never scheduled and stored nothing)."""
        tracked = self._requests.pop(request.request_id, None)
        if tracked is None:
            return None  # never matched nor scheduled
        self._capturing.pop(request.request_id, None)
        captured = self._register_captures(request, tracked.capture)
        if tracked.report is None and not captured:
            return None
        return self._report(tracked, captured)

    # -- helpers -----------------------------------------------------------------------

    def _register_captures(self, request: RequestView,
                           track: CaptureTrack | None) -> list[FactKey]:
        """Register the latest capture of each key the request stored, unless a later
        request captured the key again or it was deleted since; returns their names."""
        if track is None:
            return []
        self.facts.release(sum(span.length for span in track.emitted))
        prompt = request.prompt_token_ids
        captured = []
        for key, span in {span.key: span for span in track.emitted}.items():
            if self._capturer.get(key) != request.request_id:
                continue  # captured again by a later request, or evicted, since
            del self._capturer[key]
            tokens = prompt[span.start:span.end]
            self.facts.register(key, Registered(token_digest(tokens), len(tokens)))
            captured.append(key)
        return captured

    def _report(self, tracked: Tracked, captured: list[FactKey]) -> ConnectorReport:
        """The request's report: its injection, its moves, and the pool's levels after
        it when it changed them and the pool has a budget."""
        report, moves, facts = tracked.report or Report(), tracked.moves, self.facts
        levels: dict[str, int | None] = {}
        if (captured or moves.any()) and facts.budget_tokens is not None:
            levels.update(pool_tokens=facts.device_tokens, budget_tokens=facts.budget_tokens)
            if facts.host_budget_tokens is not None:
                levels.update(host_tokens=facts.host_tokens,
                              host_budget_tokens=facts.host_budget_tokens)
        return ConnectorReport(
            captured=tuple(captured), injected_tokens=report.injected_tokens,
            missing=tuple(report.missing), evicted=tuple(moves.evicted),
            demoted=tuple(moves.demoted), promoted=tuple(moves.promoted),
            deleted=tuple(moves.deleted), error=report.error or None, **levels)

    def _record_injection(self, request: RequestView, tracked: Tracked,
                          block_ids: list[int], num_external: int) -> None:
        """Plan the load of the KV vLLM let the request claim: pin it for this step,
        promote what is on the host, and mark it recently used."""
        assert tracked.report is not None and tracked.params is not None
        if tracked.cached and num_external == 0:  # served by vLLM's prefix cache
            tracked.report.missing, tracked.report.injected_tokens = [], 0
            touch = self.facts.touch
            for span in tracked.params.inject:
                touch(span.key)
            return
        # As matched just before in the same scheduling pass: vLLM allocated its claim.
        plan = tracked.plan or self._match(request, tracked)
        tracked.report.missing = [s.key for s in plan.missing]
        tracked.report.injected_tokens = num_external
        if num_external > 0:
            op = self._load_op(request.request_id, block_ids, plan, num_external)
            loaded = [piece[0] for piece in op.pieces]
            self.facts.pin(loaded)
            if self.facts.host:  # only a host tier can hold a fact to promote
                for key in loaded:
                    if self.facts.is_on_host(key):
                        self._promote(request.request_id, key)
            self._next.loads.append(op)
            tracked.loaded = self._loaded_blocks(op)
        touch = self.facts.touch
        for span in plan.usable:
            touch(span.key)

    def _loaded_blocks(self, op: LoadOp) -> list[tuple[FactKey, int, frozenset[int]]]:
        """``(key, tokens, cache blocks)`` of each piece of ``op``."""
        size, block_ids = self.block_size, op.block_ids
        return [(key, length, frozenset(blocks_of(block_ids, size, position, length)))
                for key, _, length, position in op.pieces]

    def _promote(self, req_id: str, key: FactKey) -> None:
        """Bring a demoted fact back to the device before its load in this step. If no
        room can be made it stays on the host; the workers then miss it and vLLM
        recomputes its blocks (correct, only slower)."""
        room = self.facts.promote(key)
        self._forward(req_id, room.moves, self._next)
        if not room.fits:
            logger.warning("no room to promote fact %s to the device", key)

    def _forward(self, req_id: str, moves: tuple[Move, ...], plan: StepPlan) -> None:
        """Hand the registry's moves to the workers in ``plan``, and to the report of
        the request they were made for."""
        plan.moves.extend(moves)
        self._requests[req_id].moves.add(moves)

    def _track(self, request: RequestView) -> Tracked:
        """The request's tracking, its params parsed on first sight."""
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            tracked = self._requests[request.request_id] = Tracked(*self._parse(request))
        return tracked

    @staticmethod
    def _parse(request: RequestView) -> tuple[RequestParams | None, str | None]:
        """The request's params, and why they were refused or cut (``None``: they were
        not)."""
        prompt_len = len(request.prompt_token_ids)
        try:
            params = parse_params(request.kv_transfer_params, prompt_len)
        except ParamsError as exc:
            # A bad request is served as a plain prompt; it must never stop the engine.
            logger.warning("request %s: ignoring kv_transfer_params: %s", request.request_id, exc)
            return None, str(exc)
        if (params is not None and params.inject
                and request.cache_salt != cache_salt(params.user, params.layout)):
            message = "injection needs the cache_salt of its user and layout"
            logger.warning("request %s: %s", request.request_id, message)
            return RequestParams(params.user, params.layout, params.capture, (),
                                 params.evict), message
        return params, None

    def _match(self, request: RequestView, tracked: Tracked) -> InjectionPlan:
        """The request's injection plan, matched again only if the registry changed
        since its last match (a fact evicted, demoted, recaptured or forgotten)."""
        if tracked.plan is None or tracked.matched_at != self.facts.version:
            tracked.plan = self._plan_injection(request, tracked)
            tracked.matched_at = self.facts.version
        return tracked.plan

    def _plan_injection(self, request: RequestView, tracked: Tracked) -> InjectionPlan:
        """Match the inject spans against the registry and the prompt's own tokens, from
        position 0 to the first span that cannot be loaded (missing, moved, forged or
        stale: recomputed, never loaded). A span's digest is hashed on its first check
        only (the prompt never changes), and no span after the first failure is hashed."""
        assert tracked.params is not None
        prompt = request.prompt_token_ids
        spans, digests, get = tracked.params.inject, tracked.digests, self.facts.get
        packed: memoryview | None = None  # the prompt as int64s, once, if any is hashed
        position = num_usable = 0
        for index, (key, start, end) in enumerate(spans):
            entry = get(key)
            if start != position or entry is None or entry.length != end - start:
                break
            digest = digests.get(index)
            if digest is None:
                if packed is None:
                    packed = memoryview(array("q", prompt))
                digest = digests[index] = token_digest(packed[start:end])
            if entry.digest != digest:
                break
            position, num_usable = end, index + 1
        # vLLM must compute at least the last prompt token itself.
        return InjectionPlan(spans[:num_usable], spans[num_usable:],
                             min(position, len(prompt) - 1))

    @staticmethod
    def _load_op(req_id: str, block_ids: list[int], plan: InjectionPlan,
                 num_external: int) -> LoadOp:
        load_start, load_end = plan.claim_end - num_external, plan.claim_end
        pieces = []
        for key, start, end in plan.usable:
            first = start if start > load_start else load_start
            last = end if end < load_end else load_end
            if first < last:
                pieces.append((key, first - start, last - first, first))
        return LoadOp(req_id, list(block_ids), pieces)

    def _track_capture(self, request: RequestView, tracked: Tracked, params: RequestParams,
                       block_ids: list[int]) -> None:
        if tracked.capture is not None:  # rescheduled after a preemption: new blocks
            tracked.capture.block_ids = list(block_ids)
            return
        prompt = request.prompt_token_ids
        wanted = [span for span in params.capture if not self._is_registered(span, prompt)]
        tracked.capture = CaptureTrack(wanted, list(block_ids))
        if wanted:
            self._capturing[request.request_id] = tracked.capture

    def _is_registered(self, span: Span, prompt: Sequence[int]) -> bool:
        entry = self.facts.get(span.key)
        tokens = prompt[span.start:span.end]
        return entry is not None and entry.digest == token_digest(tokens)

    def _emit_captures(self, req_id: str, track: CaptureTrack, computed_end: int,
                       plan: StepPlan) -> None:
        # The spans are in prompt order (parse_params sorts them; they never overlap), so
        # the ready ones come first: a long prefill is not rescanned on every step.
        num_ready = bisect_right(track.spans, computed_end, key=lambda span: span.end)
        if num_ready == 0:
            return
        ready, track.spans = track.spans[:num_ready], track.spans[num_ready:]
        if not track.spans:  # the request's later steps need nothing of it
            del self._capturing[req_id]
        emitted = []
        for span in ready:
            # The workers overwrite this key's pool entry in this step, but with async
            # scheduling later steps are planned before this request finishes: the old
            # registration must not be claimed meanwhile.
            self.facts.forget(span.key)
            room = self.facts.reserve(span.length)
            self._forward(req_id, room.moves, plan)
            if not room.fits:
                logger.warning("fact %s does not fit the KV pool budget; not captured",
                               span.key)
                plan.evicts.append(span.key)  # any older KV of it on the workers
                self._capturer.pop(span.key, None)  # an earlier capture's finish is void
                continue
            self._capturer[span.key] = req_id
            emitted.append(span)
        if emitted:
            track.emitted.extend(emitted)
            plan.captures.append(CaptureOp(req_id, list(track.block_ids), emitted))

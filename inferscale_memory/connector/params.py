"""The per-request protocol between the driver and the connector (plain data, no torch).

A request talks to the connector through ``kv_transfer_params["inferscale"]``::

    {"user": "alice",                     # who the request belongs to
     "layout": "3f2a...",                   # id of the prompt layout (part of the salt)
     "capture": [[ns, name, start, end]],   # store the KV of these prompt spans
     "inject":  [[ns, name, start, end]],   # load these facts' KV at these spans
     "evict":   [[ns, name]]}               # drop these facts' KV

``ns`` is the user that owns the fact, or ``""`` for shared entries (the prompt header,
whose tokens are the same for everyone). A request may only name its own user's facts
and shared entries; anything else is refused by :func:`parse_params`.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PARAMS_KEY = "inferscale"
SHARED_NS = ""
MAX_SPANS = 4096
MAX_NAME_CHARS = 256


class ParamsError(ValueError):
    """``kv_transfer_params`` are malformed or name another user's facts."""


@dataclass(frozen=True, order=True)
class FactKey:
    """Names one entry of the KV pool: the owning namespace and the fact's name."""

    ns: str  # user id, or SHARED_NS for the header
    name: str  # fact id (or "header:<hash>")


@dataclass(frozen=True)
class Span:
    """Prompt positions ``[start, end)`` that hold the tokens of ``key``."""

    key: FactKey
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RequestParams:
    """Validated connector instructions of one request."""

    user: str
    layout: str
    capture: tuple[Span, ...] = ()
    inject: tuple[Span, ...] = ()
    evict: tuple[FactKey, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``kv_transfer_params`` dict that carries these instructions."""
        body: dict[str, Any] = {"user": self.user, "layout": self.layout}
        if self.capture:
            body["capture"] = [[s.key.ns, s.key.name, s.start, s.end] for s in self.capture]
        if self.inject:
            body["inject"] = [[s.key.ns, s.key.name, s.start, s.end] for s in self.inject]
        if self.evict:
            body["evict"] = [[k.ns, k.name] for k in self.evict]
        return {PARAMS_KEY: body}


def cache_salt(user: str, layout: str) -> str:
    """The prefix-cache salt of injected requests: names the user and the layout.

    Injected (approximate) blocks must never be reused by plain requests or by another
    user; vLLM only shares blocks between requests with the same salt.
    """
    digest = hashlib.sha256(json.dumps([user, layout]).encode()).hexdigest()
    return f"inferscale-{digest[:40]}"


def token_digest(token_ids: Sequence[int]) -> bytes:
    """A digest of a span's token ids; the scheduler checks it before any load.

    Token ids are packed as 64-bit integers (vLLM has checked them against the vocabulary
    before the connector sees them); a few microseconds per fact, as the scheduler
    checks every fact of every request it schedules.
    """
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).digest()


def parse_params(raw: Mapping[str, Any] | None, prompt_len: int) -> RequestParams | None:
    """Validate a request's ``kv_transfer_params``; ``None`` if it has none of ours.

    Raises:
        ParamsError: malformed fields, spans outside the prompt, overlapping spans, a
            key outside the request's own user and the shared namespace, a shared
            header span not at position 0, or a capture naming a key twice.
    """
    if not raw or PARAMS_KEY not in raw:
        return None
    body = raw[PARAMS_KEY]
    if not isinstance(body, Mapping):
        raise ParamsError("kv_transfer_params['inferscale'] must be an object")
    user = body.get("user")
    layout = body.get("layout", "")
    if not isinstance(user, str) or not user or not isinstance(layout, str):
        raise ParamsError("'user' must be a non-empty string and 'layout' a string")
    capture = _spans(body.get("capture", []), user, prompt_len, "capture")
    inject = _spans(body.get("inject", []), user, prompt_len, "inject")
    evict = tuple(_key(item[:2] if isinstance(item, list) else item, user)
                  for item in _list(body.get("evict", []), "evict"))
    return RequestParams(user, layout, capture, inject, evict)


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_SPANS:
        raise ParamsError(f"'{field}' must be a list of at most {MAX_SPANS} items")
    return value


def _key(item: Any, user: str) -> FactKey:
    if (not isinstance(item, list) or len(item) != 2
            or not all(isinstance(x, str) for x in item)):
        raise ParamsError(f"a fact key must be [namespace, name], got {item!r}")
    ns, name = item
    if not name or len(name) > MAX_NAME_CHARS:
        raise ParamsError("a fact name must have 1 to 256 characters")
    if ns not in (user, SHARED_NS):
        raise ParamsError("a request may only name its own user's facts")
    if ns == SHARED_NS and not name.startswith("header:"):
        raise ParamsError("only prompt headers live in the shared namespace")
    return FactKey(ns, name)


def _spans(value: Any, user: str, prompt_len: int, field: str) -> tuple[Span, ...]:
    spans = []
    for item in _list(value, field):
        if not isinstance(item, list) or len(item) != 4:
            raise ParamsError(f"a {field} span must be [ns, name, start, end], got {item!r}")
        start, end = item[2], item[3]
        if not (isinstance(start, int) and isinstance(end, int)
                and not isinstance(start, bool) and not isinstance(end, bool)):
            raise ParamsError("span bounds must be integers")
        if not 0 <= start < end <= prompt_len:
            raise ParamsError(f"span [{start}, {end}) lies outside the prompt of {prompt_len}")
        key = _key(item[:2], user)
        if key.ns == SHARED_NS and start != 0:
            # Shared KV must depend on its tokens only, never on a user's prefix.
            raise ParamsError("a shared header span must start at position 0")
        spans.append(Span(key, start, end))
    if field == "capture" and len({s.key for s in spans}) != len(spans):
        # The worker collects a step's captures per (request, key).
        raise ParamsError("a capture may not name a key more than once")
    spans.sort(key=lambda s: s.start)
    for left, right in zip(spans, spans[1:], strict=False):
        if right.start < left.end:
            raise ParamsError(f"{field} spans overlap at position {right.start}")
    return tuple(spans)

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

``capture`` and ``inject`` may also be *packed* (what :meth:`RequestParams.to_dict`
sends): ``{"names": "hdrf1f2", "spans": bytes}``, the names concatenated and, per span,
four little-endian int64s ``(shared, start, end, name length)`` (``shared``: 1 for the
shared namespace, 0 for the request's user). A k-fact request then crosses to the engine
core as two objects instead of 5k: vLLM checks, deep-copies and encodes every item of
``extra_args``, in the front end and again in the engine core. Both forms pass the same
checks (:func:`parse_params`).
"""

from __future__ import annotations

import hashlib
import json
import operator
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from typing import Any, NamedTuple, TypeVar

PARAMS_KEY = "inferscale"
SHARED_NS = ""
MAX_SPANS = 4096
MAX_NAME_CHARS = 256
_T = TypeVar("_T")


class ParamsError(ValueError):
    """``kv_transfer_params`` are malformed or name another user's facts."""


class FactKey(NamedTuple):
    """Names one entry of the KV pool: the owning namespace and the fact's name.

    A named tuple, not a dataclass: every dict and set of facts (the registry, the pools,
    a step's loads) hashes and compares keys, a request of k facts ~10k times, and a
    tuple does that in C.
    """

    ns: str  # user id, or SHARED_NS for the header
    name: str  # fact id (or "header:<hash>")

    def __reduce__(self) -> tuple[type[FactKey], tuple[str, str]]:
        # A step plan sent to other worker processes pickles a key per load piece; a named
        # tuple's default goes through a Python __getnewargs__ first, at twice the cost.
        return FactKey, (self.ns, self.name)


class Span(NamedTuple):
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
            body["capture"] = pack_spans(self.capture)
        if self.inject:
            body["inject"] = pack_spans(self.inject)
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


def token_digest(token_ids: Sequence[int] | memoryview) -> bytes:
    """A digest of a span's token ids; the scheduler checks it before any load.

    Token ids are packed as 64-bit integers (vLLM has checked them against the vocabulary
    before the connector sees them); a few microseconds per fact, as the scheduler
    checks every fact of every request it schedules. A memoryview of int64 ids (a slice
    of a whole prompt packed once) is hashed as it is, to the same digest.
    """
    data = token_ids if isinstance(token_ids, memoryview) else array("q", token_ids)
    return hashlib.blake2b(data, digest_size=16).digest()


def pack_spans(spans: Sequence[Span]) -> dict[str, Any]:
    """The packed form of ``spans`` (see the module docstring): three objects for any
    number of spans."""
    if not spans:
        return {"ns": [], "names": "", "spans": b""}
    keys, starts, ends = zip(*spans, strict=True)
    namespaces, names = zip(*keys, strict=True)
    index = {ns: i for i, ns in enumerate(dict.fromkeys(namespaces))}
    rows = array("q", bytes(32 * len(spans)))
    for column, values in enumerate(([index[ns] for ns in namespaces], starts, ends,
                                     list(map(len, names)))):
        rows[column::4] = array("q", values)
    if sys.byteorder == "big":
        rows.byteswap()
    return {"ns": list(index), "names": "".join(names), "spans": rows.tobytes()}


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
    evict = _keys([item[:2] if isinstance(item, list) else item
                   for item in _list(body.get("evict", []), "evict")], user)
    return RequestParams(user, layout, capture, inject, evict)


class _Columns(NamedTuple):
    """Spans (or keys) as columns, in either wire form, before any semantic check."""

    namespaces: list[str]  # the distinct namespaces named
    ns_ids: list[int]  # per span: its index in ``namespaces``
    names: list[str]
    starts: list[int]
    ends: list[int]


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_SPANS:
        raise ParamsError(f"'{field}' must be a list of at most {MAX_SPANS} items")
    return value


def _columns(items: list[Any], field: str) -> _Columns:
    """The documented list form's ``[ns, name, start, end]`` items, as columns."""
    index: dict[str, int] = {}
    ns_ids, names, starts, ends = [], [], [], []
    for item in items:
        if not isinstance(item, list) or len(item) != 4:
            raise ParamsError(f"a {field} span must be [ns, name, start, end], got {item!r}")
        ns, name, start, end = item
        if (isinstance(start, bool) or isinstance(end, bool)
                or not (isinstance(start, int) and isinstance(end, int))):
            raise ParamsError("span bounds must be integers")
        if not (isinstance(ns, str) and isinstance(name, str)):
            raise ParamsError(f"a fact key must be [namespace, name], got {item[:2]!r}")
        ns_ids.append(index.setdefault(ns, len(index)))
        names.append(name)
        starts.append(start)
        ends.append(end)
    return _Columns(list(index), ns_ids, names, starts, ends)


def _unpack(value: Mapping[str, Any], field: str) -> _Columns:
    """The packed form's columns (see the module docstring)."""
    namespaces, names, raw = value.get("ns"), value.get("names"), value.get("spans")
    if (len(value) != 3 or not isinstance(namespaces, list) or len(namespaces) > MAX_SPANS
            or not all(isinstance(ns, str) for ns in namespaces)
            or not isinstance(names, str) or not isinstance(raw, bytes)
            or len(raw) % 32 or len(raw) > 32 * MAX_SPANS):
        raise ParamsError(f"a packed '{field}' must be {{'ns': [str], 'names': str, "
                          f"'spans': int64 bytes}}, at most {MAX_SPANS} spans")
    rows = array("q")
    rows.frombytes(raw)
    if sys.byteorder == "big":
        rows.byteswap()
    ns_ids, starts, ends, lengths = (rows[column::4].tolist() for column in range(4))
    if ns_ids and not 0 <= min(ns_ids) <= max(ns_ids) < len(namespaces):
        raise ParamsError(f"a packed '{field}' span names a namespace it does not list")
    if (lengths and min(lengths) < 0) or sum(lengths) != len(names):
        raise ParamsError(f"the packed '{field}' names do not match their lengths")
    offsets = list(accumulate(lengths, initial=0))
    names_list = list(map(names.__getitem__, map(slice, offsets, offsets[1:])))
    return _Columns(namespaces, ns_ids, names_list, starts, ends)


def _keys(items: list[Any], user: str) -> tuple[FactKey, ...]:
    """Checked ``[ns, name]`` items."""
    index: dict[str, int] = {}
    ns_ids, names = [], []
    for item in items:
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(x, str) for x in item)):
            raise ParamsError(f"a fact key must be [namespace, name], got {item!r}")
        ns_ids.append(index.setdefault(item[0], len(index)))
        names.append(item[1])
    return tuple(_checked_keys(_Columns(list(index), ns_ids, names, [], []), user)[0])


def _checked_keys(columns: _Columns, user: str) -> tuple[list[FactKey], list[int]]:
    """The keys of ``columns``, if each names a fact its request may name, and the
    indices of those in the shared namespace."""
    namespaces, ns_ids, names = columns.namespaces, columns.ns_ids, columns.names
    lengths = list(map(len, names))
    if lengths and (min(lengths) < 1 or max(lengths) > MAX_NAME_CHARS):
        raise ParamsError("a fact name must have 1 to 256 characters")
    if any(ns not in (user, SHARED_NS) for ns in namespaces):
        raise ParamsError("a request may only name its own user's facts")
    shared: list[int] = []
    if SHARED_NS in namespaces:
        is_shared = namespaces.index(SHARED_NS).__eq__
        shared = list(compress(range(len(ns_ids)), map(is_shared, ns_ids)))
        if not all(names[i].startswith("header:") for i in shared):
            raise ParamsError("only prompt headers live in the shared namespace")
    return _make_all(FactKey, zip(map(namespaces.__getitem__, ns_ids), names,
                                  strict=True)), shared


def _make_all(cls: type[_T], rows: Iterable[tuple[Any, ...]]) -> list[_T]:
    """``cls(*row)`` of each row, made as the named tuple's own ``_make`` makes it, with no
    Python call per row (a request names up to thousands of spans)."""
    return list(map(tuple.__new__, repeat(cls), rows))  # type: ignore[arg-type]


def _spans(value: Any, user: str, prompt_len: int, field: str) -> tuple[Span, ...]:
    columns = (_unpack(value, field) if isinstance(value, Mapping)
               else _columns(_list(value, field), field))
    starts, ends = columns.starts, columns.ends
    if starts and (min(starts) < 0 or max(ends) > prompt_len
                   or not all(map(operator.lt, starts, ends))):
        start, end = next((a, b) for a, b in zip(starts, ends, strict=True)
                          if not 0 <= a < b <= prompt_len)
        raise ParamsError(f"span [{start}, {end}) lies outside the prompt of {prompt_len}")
    keys, shared = _checked_keys(columns, user)
    if any(starts[i] != 0 for i in shared):
        # Shared KV must depend on its tokens only, never on a user's prefix.
        raise ParamsError("a shared header span must start at position 0")
    if field == "capture" and len(set(keys)) != len(keys):
        # The worker collects a step's captures per (request, key).
        raise ParamsError("a capture may not name a key more than once")
    spans = _make_all(Span, zip(keys, starts, ends, strict=True))
    if not all(map(operator.le, starts, starts[1:])):
        spans.sort(key=lambda s: s.start)
        starts, ends = [s.start for s in spans], [s.end for s in spans]
    if not all(map(operator.le, ends, starts[1:])):
        position = next(b for a, b in zip(ends, starts[1:], strict=False) if b < a)
        raise ParamsError(f"{field} spans overlap at position {position}")
    return tuple(spans)

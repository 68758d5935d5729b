"""What the connector did for one request: :class:`ConnectorReport` (plain data, no torch).

The scheduler side builds one when a request finishes; vLLM carries it from the engine
core to the front end as the output's ``kv_transfer_params["inferscale"]``, a dict of
JSON values (:meth:`ConnectorReport.to_dict`), and the runtime reads it back with
:meth:`ConnectorReport.from_output`. Both ends are this module: a field is added or renamed
here, once, and a body that does not fit is refused with :class:`ReportError`.

The wire body, with every optional field shown::

    {"captured": [[ns, name]],            # facts whose KV the request stored
     "injected_tokens": 20, "missing": [[ns, name]],
     "evicted": ..., "demoted": ..., "promoted": ..., "deleted": ...,   # when not empty
     "pool_tokens": 18, "budget_tokens": 100,                # when the pool has a budget
     "host_tokens": 12, "host_budget_tokens": 30,            # when there is a host tier
     "error": "..."}                                         # when the params were refused
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from inferscale_memory.connector.params import PARAMS_KEY, FactKey
from inferscale_memory.errors import EngineError

_ALWAYS = ("captured", "injected_tokens", "missing")  # on the wire even when empty
_KEY_LISTS = ("captured", "missing", "evicted", "demoted", "promoted", "deleted")
_COUNTS = ("injected_tokens", "pool_tokens", "budget_tokens", "host_tokens",
           "host_budget_tokens")


class ReportError(EngineError, ValueError):
    """A connector report that does not fit :class:`ConnectorReport` (a connector of
    another inferscale-memory version in the engine, or a bug): its message names the
    field."""


@dataclass(frozen=True)
class ConnectorReport:
    """What the connector did for one request (see the module docstring).

    Example:
        >>> report = ConnectorReport(injected_tokens=20, missing=(FactKey("alice", "f1"),))
        >>> report.to_dict()
        {'captured': [], 'injected_tokens': 20, 'missing': [['alice', 'f1']]}
        >>> ConnectorReport.from_dict(report.to_dict()) == report
        True
    """

    captured: tuple[FactKey, ...] = ()  # facts (and headers) whose KV the request stored
    injected_tokens: int = 0  # prompt tokens whose KV the workers wrote (header and facts)
    missing: tuple[FactKey, ...] = ()  # named for injection, KV absent: vLLM computed them
    evicted: tuple[FactKey, ...] = ()  # dropped to make room (device pool or host tier)
    demoted: tuple[FactKey, ...] = ()  # moved from the device pool to the host tier
    promoted: tuple[FactKey, ...] = ()  # copied back from the host tier for this request
    deleted: tuple[FactKey, ...] = ()  # held, and dropped by this (evict) request
    pool_tokens: int | None = None  # device pool rows after it; None: not reported
    budget_tokens: int | None = None  # the device pool's budget, with pool_tokens
    host_tokens: int | None = None  # host tier rows after it; None: no host tier
    host_budget_tokens: int | None = None  # the host tier's budget, with host_tokens
    error: str | None = None  # why the request's params were refused or cut

    def to_dict(self) -> dict[str, Any]:
        """The wire body: JSON values only, the empty optional fields left out."""
        body: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _KEY_LISTS:
                value = [[key.ns, key.name] for key in value]
            if f.name in _ALWAYS or (value is not None and value != []):
                body[f.name] = value
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ConnectorReport:
        """The report a wire body describes; a field left out takes its default.

        Raises:
            ReportError: ``body`` is no mapping, has a field this class lacks, or a
                value of the wrong shape.
        """
        if not isinstance(body, Mapping):
            raise ReportError(f"a connector report must be a mapping, not {type(body).__name__}")
        unknown = sorted(set(body) - {f.name for f in fields(cls)})
        if unknown:
            raise ReportError(f"unknown connector report fields {unknown}: the engine runs "
                              "a connector of another inferscale-memory version?")
        values: dict[str, Any] = {}
        for name, value in body.items():
            if name in _KEY_LISTS:
                values[name] = _keys(name, value)
            elif name in _COUNTS:
                values[name] = _count(name, value)
            elif not isinstance(value, str | None):
                raise ReportError(f"connector report field {name!r} must be a string, "
                                  f"not {value!r}")
            else:
                values[name] = value
        return cls(**values)

    @classmethod
    def from_output(cls, kv_transfer_params: Mapping[str, Any] | None) -> ConnectorReport:
        """The report in a finished output's ``kv_transfer_params`` (an empty one when
        the connector said nothing, as for a request it never saw)."""
        return cls.from_dict((kv_transfer_params or {}).get(PARAMS_KEY) or {})

    def to_output(self) -> dict[str, Any]:
        """The ``kv_transfer_params`` of a finished request that carry this report."""
        return {PARAMS_KEY: self.to_dict()}


def _keys(name: str, value: Any) -> tuple[FactKey, ...]:
    if not isinstance(value, list | tuple):
        raise ReportError(f"connector report field {name!r} must be a list of "
                          f"[namespace, name] pairs, not {value!r}")
    for item in value:
        if (not isinstance(item, list | tuple) or len(item) != 2
                or not all(isinstance(part, str) for part in item)):
            raise ReportError(f"connector report field {name!r} holds {item!r}, "
                              "not a [namespace, name] pair of strings")
    return tuple(FactKey(ns, key) for ns, key in value)


def _count(name: str, value: Any) -> int | None:
    if value is None and name != "injected_tokens":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReportError(f"connector report field {name!r} must be a count of tokens "
                          f"(an int >= 0), not {value!r}")
    return value

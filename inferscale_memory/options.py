"""Checks of the per-request generation options of :meth:`MemoryEngine.chat`.

Every option is checked here, before vLLM sees it: vLLM's engine core decodes requests
in a thread of its own, and a value of the wrong type there (``seed="x"``,
``temperature=True`` with vLLM 0.32) stops that thread, after which no request is ever
answered again.
"""

from __future__ import annotations

import math
from typing import Any

from inferscale_memory.errors import InvalidInputError
from inferscale_memory.layout import is_unicode

OPTIONS = ("max_tokens", "temperature", "stop", "seed", "logprobs", "ignore_eos", "top_p",
           "top_k", "presence_penalty", "frequency_penalty")
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what vLLM's seeded generators accept
MAX_STOPS = 16
MAX_STOP_CHARS = 256
DEFAULT_MAX_LOGPROBS = 20  # vLLM's default max_logprobs


def check_options(options: dict[str, Any], *, default_max_tokens: int,
                  max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> dict[str, Any]:
    """Check the options of one chat call and return them with defaults filled in.

    Args:
        options: Any of ``max_tokens``, ``temperature``, ``stop``, ``seed``, ``logprobs``,
            ``ignore_eos``, ``top_p`` (in (0, 1]), ``top_k`` (>= 0; 0: every token),
            ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]), as vLLM and
            OpenAI take them; ``None`` means the default.
        default_max_tokens: ``max_tokens`` when it is absent.
        max_logprobs: The engine's largest ``logprobs``.

    Returns:
        A new dict with ``max_tokens`` and ``temperature`` always set (ints and a float),
        ``stop`` as a list, and the other options given.

    Raises:
        InvalidInputError: An unknown option or a value of the wrong type or range.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise InvalidInputError(f"unknown options {sorted(unknown)}; known: {list(OPTIONS)}")
    given = {key: value for key, value in options.items() if value is not None}
    out: dict[str, Any] = {
        "max_tokens": _int(given.get("max_tokens", default_max_tokens), "max_tokens", 1),
        "temperature": _temperature(given.get("temperature", 0.0)),
    }
    if "stop" in given:
        out["stop"] = _stops(given["stop"])
    if "seed" in given:
        out["seed"] = _int(given["seed"], "seed", SEED_MIN, SEED_MAX)
    if "logprobs" in given:
        out["logprobs"] = _int(given["logprobs"], "logprobs", 0, max_logprobs)
    if "ignore_eos" in given:
        if not isinstance(given["ignore_eos"], bool):
            raise InvalidInputError(
                f"ignore_eos must be true or false; got {given['ignore_eos']!r:.50}")
        out["ignore_eos"] = given["ignore_eos"]
    if "top_p" in given:
        out["top_p"] = _number(given["top_p"], "top_p", 0.0, 1.0, low_open=True)
    if "top_k" in given:
        out["top_k"] = _int(given["top_k"], "top_k", 0)
    for name in ("presence_penalty", "frequency_penalty"):
        if name in given:
            out[name] = _number(given[name], name, -2.0, 2.0)
    return out


def _number(value: Any, name: str, low: float, high: float, low_open: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not (low < value if low_open else low <= value)
            or value > high):
        span = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise InvalidInputError(f"{name} must be a number in {span}; got {value!r:.50}")
    return float(value)


def _int(value: Any, name: str, low: int, high: int | None = None) -> int:
    if (isinstance(value, bool) or not isinstance(value, int) or value < low
            or (high is not None and value > high)):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidInputError(f"{name} must be an integer {span}; got {value!r:.50}")
    return value


def _temperature(value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 <= value <= 2):
        raise InvalidInputError(f"temperature must be a number in [0, 2]; got {value!r:.50}")
    return float(value)


def _stops(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if (not isinstance(stops, list | tuple) or len(stops) > MAX_STOPS
            or not all(_is_stop(s) for s in stops)):
        raise InvalidInputError(
            f"stop must be a string or a list of at most {MAX_STOPS} strings of 1 to "
            f"{MAX_STOP_CHARS} characters; got {value!r:.80}")
    return list(stops)


def _is_stop(value: Any) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= MAX_STOP_CHARS
            and is_unicode(value))

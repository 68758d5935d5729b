"""The types of the settings and arguments that several parts check: each rule once.

The config (:class:`~inferscale_memory.MemoryConfig`), the chat options
(:mod:`inferscale_memory.options`), the engine's per-call arguments, the store's checks and
the server's request schemas all take their fields from here, so that what ``fact_order``
may be, how high ``top_p`` goes or what valid Unicode is cannot drift apart between them.

Example:
    >>> check(FactOrder, "time", "fact_order")
    'time'
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import AfterValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError

from inferscale_memory.errors import InvalidInputError

# -- memory: how an answer uses the user's facts ---------------------------------------------

FactOrder = Literal["rank", "time"]  # best-ranked fact last, or oldest first
# a capture context oldest first, or least similar first (the nearest fact right before the fact)
ContextOrder = Literal["added", "similarity"]
IndexBackend = Literal["exact", "qdrant", "hnsw"]
StoreKind = Literal["sqlite", "postgres"]
Mode = Literal["kv", "text"]  # inject the facts' KV, or prefill the same tokens as text
FACT_ORDERS: tuple[str, ...] = get_args(FactOrder)
INDEX_BACKENDS: tuple[str, ...] = get_args(IndexBackend)
STORES: tuple[str, ...] = get_args(StoreKind)
MODES: tuple[str, ...] = get_args(Mode)
CONTEXT_ORDERS: tuple[str, ...] = get_args(ContextOrder)

_T = TypeVar("_T")


def in_context_order(nearest_first: Sequence[_T], order: str,
                     added: Callable[[_T], Any]) -> list[_T]:
    """A fact's capture context in ``order`` (``capture_context_order``), from its
    neighbours best first: oldest first by ``added``, or least similar first.

    >>> in_context_order(["b", "c", "a"], "similarity", added=str)
    ['a', 'c', 'b']
    >>> in_context_order(["b", "c", "a"], "added", added=str)
    ['a', 'b', 'c']
    """
    if order == "similarity":
        return list(reversed(nearest_first))
    return sorted(nearest_first, key=added)
MAX_CAPTURE_CONTEXT = 32

FactCount = Annotated[int, Field(ge=1)]  # k: facts retrieved per answer
RecomputeTail = Annotated[int, Field(ge=0)]  # facts at the span's end computed from text
CaptureContext = Annotated[int, Field(ge=0, le=MAX_CAPTURE_CONTEXT)]

# -- generation: what vLLM's engine core can decode (a wrong type there stops its thread) --

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what vLLM's seeded generators accept
# KV-cache dtypes whose facts can be captured and injected: the model's dtype, and fp8
# with per-layer (or per-head) scales, whose moved keys are dequantized, rotated and
# quantized again (inferscale_memory/kv/quant.py). vLLM's other cache dtypes (int8/int4/fp8
# per token and head, nvfp4, turboquant, fp8_inc, MLA's) keep scales per token or pack
# elements, and are refused.
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
MAX_STOPS = 16
MAX_STOP_CHARS = 256

MaxTokens = Annotated[int, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
TopK = Annotated[int, Field(ge=0)]  # 0: every token, as vLLM
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
Logprobs = Annotated[int, Field(ge=0)]  # the engine's max_logprobs bounds it


def unicode_text(value: str, name: str = "the text") -> str:
    """Check that ``value`` is valid Unicode: no lone surrogates, which UTF-8 (SQLite,
    tokenizers, JSON responses) cannot encode.

    Raises:
        InvalidInputError: ``value`` holds a lone surrogate.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{name} holds a lone surrogate ({value[exc.start]!r} at position {exc.start}); "
            "send valid Unicode text"
        ) from None
    return value


UnicodeText = Annotated[str, AfterValidator(unicode_text)]
StopString = Annotated[UnicodeText, Strict(), Field(min_length=1, max_length=MAX_STOP_CHARS)]
# A list (or, from Python, a tuple) of stop strings; the strings themselves stay strict.
Stop = StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS, strict=False)]


def kv_cache_dtype_problem(cache_dtype: Any) -> str | None:
    """Why facts' KV cannot live in a vLLM cache of ``cache_dtype`` (its
    ``kv_cache_dtype``), or ``None`` when it can (``"auto"``: the model's dtype; fp8)."""
    name = str(cache_dtype or "auto")
    if name in KV_CACHE_DTYPES:
        return None
    return (f"kv_cache_dtype={name!r} is not supported: inferscale-memory injects facts "
            f"into caches of {', '.join(map(repr, KV_CACHE_DTYPES))}; a cache with "
            "per-token scales or packed elements would need its own re-quantization of "
            "moved keys; use kv_cache_dtype='fp8' (half the bytes of the model's dtype) or "
            "'auto' (the model's dtype)")


# The tags pydantic puts in an error's location for the member of a union that failed
# ("str", "none", a model's class name); the bracketed ones ("list[str]") are no names.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "bytes"})


def _path(loc: tuple[int | str, ...], name: str | None) -> str:
    """An error's location as the dotted parameter it names (``stop.1``,
    ``tools.0.function.name``), without the tags of union members."""
    parts = [str(part) for part in loc if isinstance(part, int) or (
        part.isidentifier() and part[:1].islower() and part not in _UNION_TAGS)]
    return ".".join(([name] if name else []) + parts)


def describe(exc: ValidationError, name: str | None = None) -> str:
    """One line per failed field of ``exc``, each naming the field (``name`` for a bare
    value, else the prefix of the fields' names) and the value it got."""
    lines = []
    for error in exc.errors():
        loc = _path(error["loc"], name)
        message = error["msg"].removeprefix("Value error, ")
        got = "" if error["type"] == "value_error" else f"; got {error['input']!r:.80}"
        lines.append(f"{loc}: {message}{got}" if loc else message)
    return "; ".join(dict.fromkeys(lines))


def invalid(exc: ValidationError, name: str | None = None) -> InvalidInputError:
    """``exc`` as the :class:`InvalidInputError` the engine raises: :func:`describe`'s
    message, and the ``param`` of the first field at fault (``name``, then the path in it;
    none where ``name`` is prose, such as "a fact's text"). Where the members of a union
    failed, the deepest path names it: ``stop.1`` for the list whose second string is bad.
    """
    paths = [_path(error["loc"], name) for error in exc.errors()]
    field = paths[0].split(".")[0] if paths else ""
    param = max((p for p in paths if p.split(".")[0] == field), key=lambda p: p.count("."),
                default="")
    named = param and all(part.isidentifier() or part.isdigit() for part in param.split("."))
    return InvalidInputError(describe(exc, name), param if named else None)


def check(kind: Any, value: Any, name: str) -> Any:
    """Check ``value`` against the type ``kind`` strictly (no ``"1"`` for ``1``, no ``True``
    for an int) and return it.

    Raises:
        InvalidInputError: ``value`` is not a ``kind``; the message and ``param`` name
            ``name``.
    """
    try:
        return _adapter(kind).validate_python(value)
    except ValidationError as exc:
        raise invalid(exc, name) from None


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind, config=ConfigDict(strict=True))

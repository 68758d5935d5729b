"""``bench compare RUN_A RUN_B``: the numbers that differ between two runs' summaries.

Summaries are flattened to dotted keys; list items are named by their identifying fields
(``by_k[k=10].kv.f1``, ``throughput[concurrency=4,pattern=batch,mode=kv].requests_per_s``).
"""

from __future__ import annotations

import math
from typing import Any

IDENTITY = ("k", "concurrency", "pattern", "mode")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Numeric and string leaves of a summary by dotted key.

    Example:
        >>> flatten({"by_k": [{"k": 5, "kv": {"f1": 0.2}}]})
        {'by_k[k=5].k': 5, 'by_k[k=5].kv.f1': 0.2}
    """
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, item in enumerate(value):
            ident = ",".join(f"{f}={item[f]}" for f in IDENTITY if f in item) or str(i)
            out.update(flatten(item, f"{prefix}[{ident}]"))
        return out
    return {prefix: value}


def differences(a: dict[str, Any], b: dict[str, Any], only: str = ""
                ) -> list[tuple[str, Any, Any]]:
    """(key, value in A, value in B) for every key whose values differ (or is in one only);
    ``only`` keeps the keys that contain it."""
    flat_a, flat_b = flatten(a), flatten(b)
    keys = [key for key in dict.fromkeys([*flat_a, *flat_b]) if only in key]
    return [(key, flat_a.get(key), flat_b.get(key)) for key in keys
            if not _same(flat_a.get(key), flat_b.get(key))]


def format_differences(a: dict[str, Any], b: dict[str, Any], only: str = "") -> str:
    """A table of the differences: key, A, B, B - A and the relative change."""
    rows = differences(a, b, only)
    if not rows:
        return "no differences"
    lines = ["| key | A | B | B - A | change |", "|---|---|---|---|---|"]
    for key, x, y in rows:
        delta = change = ""
        if _is_number(x) and _is_number(y):
            delta = f"{y - x:+.4g}"
            change = f"{(y - x) / abs(x):+.1%}" if x else ""
        lines.append(f"| {key} | {_fmt(x)} | {_fmt(y)} | {delta} | {change} |")
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        not math.isnan(value)


def _same(x: Any, y: Any) -> bool:
    if _is_number(x) and _is_number(y):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(x, float) and isinstance(y, float):
        return math.isnan(x) and math.isnan(y)
    return bool(x == y)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

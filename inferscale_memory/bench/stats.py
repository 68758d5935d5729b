"""Summary statistics of benchmark samples: nearest-rank percentiles, paired differences."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100] (NaN for no values).

    Example:
        >>> percentile([1, 2, 3, 4, 5], 50)
        3
    """
    ordered = sorted(values)
    if not ordered:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    return ordered[round(q / 100 * (len(ordered) - 1))]


def median(values: Iterable[float]) -> float:
    ordered = list(values)
    return statistics.median(ordered) if ordered else math.nan


def mean(values: Iterable[float | None]) -> float:
    """Mean of the values that are not ``None`` (NaN if there are none)."""
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else math.nan


def latency_stats(values_ms: Sequence[float]) -> dict[str, float]:
    """Median, p90 and p99 of latencies (ms)."""
    return {"median_ms": median(values_ms), "p90_ms": percentile(values_ms, 90),
            "p99_ms": percentile(values_ms, 99)}


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean of ``a - b`` over paired samples and the half-width of its 95% interval.

    Example:
        >>> paired_difference([1.0, 1.0], [0.5, 0.5])
        (0.5, 0.0)
    """
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if not diffs:
        return math.nan, math.nan
    if len(diffs) == 1:
        return diffs[0], math.nan
    return statistics.fmean(diffs), 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs))

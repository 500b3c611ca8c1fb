"""``pct``: the nearest-rank percentile every benchmark prints."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

"""Reading series out of a Prometheus text page (the format vLLM's ``GET /metrics`` serves)."""

from __future__ import annotations

import math


def sum_series(text: str, names: set[str] | frozenset[str]) -> dict[str, tuple[float, int]]:
    """Per metric name in ``names`` that the page has: (the sum of its values over label sets,
    e.g. one per engine; how many series were summed).  Comment lines, other names and
    values that are not numbers (or NaN) are skipped."""
    out: dict[str, tuple[float, int]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in names:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if math.isnan(value):
            continue
        total, count = out.get(name, (0.0, 0))
        out[name] = (total + value, count + 1)
    return out

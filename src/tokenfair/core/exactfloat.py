"""Repeated float additions, bit for bit, in O(1) when that is provably exact.

Aggregating ``k`` identical steps must not change a single bit of the statistics that later
decisions read: ``acc += x`` done ``k`` times is, in general, *not* ``acc + k * x`` in floating
point.  It is when every partial sum is an integer of magnitude at most 2**53 (each addition
is then exact), which covers the common case of integer cost weights; otherwise the loop runs.
"""

from __future__ import annotations

from typing import Final

_EXACT: Final = 9007199254740992.0     # 2**53 (a literal: compiled, a constant)


def add_repeated(acc: float, x: float, k: int) -> float:
    """``acc`` (a float) after ``k`` times ``acc += x``: O(1) when every partial sum is an
    integer below 2**53 in magnitude, else O(k)."""
    if k > 0:
        # the bound first (it is False for inf and nan), then integrality as native float
        # and int conversions (performance: ``float.is_integer`` is a boxed method call)
        if abs(acc) + k * abs(x) <= _EXACT and acc == float(int(acc)) and x == float(int(x)):
            return acc + k * x
        for _ in range(k):
            acc += x
    return acc

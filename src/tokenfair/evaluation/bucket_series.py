"""Per-bucket series kept sparse: a name's service (only the buckets that had service) and its
backlog (merged intervals of buckets), with the sums the fairness metrics read.

Memory is O(buckets with service + backlog intervals) per name, not O(run length x names) as
dense per-bucket arrays are: a trace with a long quiet span, or thousands of tenants, costs
what happened in it.  Every figure equals the dense arrays' float for float:

* a window's service is summed over a dense window-length array (numpy's pairwise sum of the
  same values in the same order as a slice of the dense series);
* a range's service is a difference of sequential prefix sums (``np.cumsum`` over the dense
  series adds 0.0 in the empty buckets, which changes no partial sum);
* the service of a set of buckets (a class's backlogged buckets) is summed over the dense
  array of exactly those buckets' values, zeros included (the dense mask's selection);
* backlog counts are integers.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np


def bucket_items(series: dict, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """A timeline series ``{bucket: value}`` (keys may be strings, as read from JSON) as its
    buckets in ``[0, n_buckets)``, ascending, and each one's value (values of one bucket
    added from 0.0, as into a dense array; buckets outside are left out)."""
    acc: dict[int, float] = {}
    for b, v in series.items():
        b = int(b)
        if 0 <= b < n_buckets:
            acc[b] = acc.get(b, 0.0) + v
    keys = sorted(acc)
    return np.array(keys, dtype=np.int64), np.array([acc[k] for k in keys], dtype=np.float64)


class ServiceSeries:
    """One name's service per bucket.  Invariants: ``buckets`` ascending, unique, each in
    ``[0, n_buckets)``; ``values[i]`` the service in ``buckets[i]``; ``prefix[i]`` the
    sequential sum of ``values[:i]`` (``prefix[0] = 0.0``)."""

    __slots__ = ("buckets", "values", "prefix")

    def __init__(self, buckets: np.ndarray, values: np.ndarray) -> None:
        self.buckets = buckets
        self.values = values
        self.prefix = np.concatenate(([0.0], np.cumsum(values)))

    @classmethod
    def of(cls, series: dict, n_buckets: int) -> "ServiceSeries":
        """From the timeline's ``{bucket: service}`` (:func:`bucket_items`)."""
        return cls(*bucket_items(series, n_buckets))

    @classmethod
    def total(cls, series: Iterable["ServiceSeries"]) -> "ServiceSeries":
        """The per-bucket sum over ``series`` in their order (each bucket's values added one
        after another, as summing the dense arrays elementwise does)."""
        parts = list(series)
        if not parts:
            return cls(np.zeros(0, dtype=np.int64), np.zeros(0))
        keys = np.unique(np.concatenate([s.buckets for s in parts]))
        acc = np.zeros(len(keys))
        for s in parts:
            acc[np.searchsorted(keys, s.buckets)] += s.values
        return cls(keys, acc)

    def window_sum(self, start: int, width: int) -> float:
        """Service over buckets ``[start, start + width)``."""
        lo, hi = np.searchsorted(self.buckets, (start, start + width))
        dense = np.zeros(width)
        dense[self.buckets[lo:hi] - start] = self.values[lo:hi]
        return float(dense.sum())

    def sum_at(self, positions: np.ndarray) -> float:
        """Service summed over the ascending buckets ``positions`` (0.0 where none)."""
        dense = np.zeros(len(positions))
        if len(self.buckets) and len(positions):
            idx = np.searchsorted(positions, self.buckets)
            hit = idx < len(positions)
            hit[hit] = positions[idx[hit]] == self.buckets[hit]
            dense[idx[hit]] = self.values[hit]
        return float(dense.sum())

    def below(self, x: np.ndarray) -> np.ndarray:
        """Per element of ``x``: the service in buckets ``< x`` (the dense prefix sum at x)."""
        return self.prefix[np.searchsorted(self.buckets, x)]


class BacklogIntervals:
    """The buckets in which a name was backlogged, as disjoint half-open intervals.
    Invariants: ``starts`` ascending; ``starts[i] < ends[i] <= starts[i + 1]``; all within
    ``[0, n_buckets)``; ``covered_before[i]`` the buckets in intervals ``< i``."""

    __slots__ = ("starts", "ends", "covered_before")

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts = starts
        self.ends = ends
        self.covered_before = np.concatenate(([0], np.cumsum(ends - starts)))

    @classmethod
    def merged(cls, a: np.ndarray, b: np.ndarray) -> "BacklogIntervals":
        """The union of the intervals ``[a[i], b[i])`` (empty ones dropped)."""
        keep = a < b
        a, b = a[keep], b[keep]
        if not len(a):
            return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        order = np.lexsort((b, a))
        a, b = a[order], b[order]
        reach = np.maximum.accumulate(b)
        first = np.concatenate(([True], a[1:] > reach[:-1]))
        starts = a[first]
        last = np.concatenate((np.flatnonzero(first)[1:] - 1, [len(a) - 1]))
        return cls(starts, reach[last])

    def covered(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per pair, the backlogged buckets in ``[lo, hi)``."""
        return self._covered_below(hi) - self._covered_below(lo)

    def _covered_below(self, x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.starts, x, side="left")      # intervals starting below x
        out = np.zeros(len(x), dtype=np.int64)
        has = k > 0
        j = k[has] - 1
        out[has] = self.covered_before[j] + np.minimum(x[has], self.ends[j]) - self.starts[j]
        return out

    def window_counts(self, width: int, num_windows: int) -> tuple[np.ndarray, np.ndarray]:
        """The windows ``[w * width, (w + 1) * width)``, ``w < num_windows``, that hold
        backlogged buckets, ascending, and how many each holds."""
        if not len(self.starts) or num_windows <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        first = self.starts // width
        last = np.minimum((self.ends - 1) // width, num_windows - 1)
        keep = first <= last
        first, last = first[keep], last[keep]
        if not len(first):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        windows = np.unique(np.concatenate([np.arange(f, l + 1) for f, l in zip(first.tolist(), last.tolist())]))
        return windows, self.covered(windows * width, (windows + 1) * width)

    def positions(self) -> np.ndarray:
        """Every backlogged bucket, ascending."""
        if not len(self.starts):
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s, e) for s, e in zip(self.starts.tolist(), self.ends.tolist())])

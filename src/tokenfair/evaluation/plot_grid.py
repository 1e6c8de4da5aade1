"""A run's timeline at plot resolution: at most ``MAX_PLOT_POINTS`` points a line, each point
``per_point`` whole buckets, so a trace spanning months plots in the time and memory of a
short one.  With ``per_point == 1`` every series is the per-bucket one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from .bucket_series import BacklogIntervals, bucket_items

MAX_PLOT_POINTS: Final = 2000


@dataclass(frozen=True)
class PlotGrid:
    n_buckets: int          # the run's buckets (>= 1): 1 + its last bucket with a step
    per_point: int          # buckets a point spans (>= 1); the last point may span fewer
    bucket_s: float

    @classmethod
    def of(cls, timeline: dict) -> "PlotGrid":
        n = 1 + max([int(b) for b in timeline["tokens"]] or [0])
        return cls(n, max(1, -(-n // MAX_PLOT_POINTS)), float(timeline.get("bucket_s", 1.0)))

    @property
    def num_points(self) -> int:
        return -(-self.n_buckets // self.per_point)

    def x(self) -> np.ndarray:
        """Each point's end, in seconds."""
        return (np.arange(self.num_points) + 1) * self.per_point * self.bucket_s

    def sums(self, series: dict) -> np.ndarray:
        """A per-bucket series (``{bucket: value}``) summed per point."""
        keys, values = bucket_items(series, self.n_buckets)
        return np.bincount(keys // self.per_point, weights=values, minlength=self.num_points)

    def last_values(self, series: dict) -> np.ndarray:
        """A gauge (queue length, KV use) at each point's last bucket, carried forward over
        buckets without steps; 0 before its first value."""
        keys, values = bucket_items(series, self.n_buckets)
        last = np.minimum((np.arange(self.num_points) + 1) * self.per_point, self.n_buckets) - 1
        idx = np.searchsorted(keys, last, side="right") - 1
        return np.where(idx >= 0, values[np.maximum(idx, 0)] if len(values) else 0.0, 0.0)

    def backlogged(self, intervals: BacklogIntervals) -> np.ndarray:
        """Per point: backlogged in at least half its buckets."""
        lo = np.arange(self.num_points) * self.per_point
        hi = np.minimum(lo + self.per_point, self.n_buckets)
        return intervals.covered(lo, hi) >= 0.5 * (hi - lo)


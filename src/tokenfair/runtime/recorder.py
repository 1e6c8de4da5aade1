"""What a run records besides the per-request states: service over time, queue, KV, preemptions.

Service is bucketed per ``bucket_s`` (1 s) of simulated/wall time, per tenant and per class,
in cost-weighted tokens (the contract's prefill/decode weights), so shares and Jain's index
can be computed over any window made of whole buckets.  Memory: O(buckets x active tenants),
16 bytes each (:class:`Series`).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from typing import Callable, ClassVar

from ..contracts.contract import CostWeights
from ..core.exactfloat import add_repeated
from ..core.request import count_by_tenant_and_class
from ..sched.interface import SchedulerOutput


class Series:
    """One name's service per bucket, compactly (16 bytes a bucket): the closed buckets
    ascending with their values, then the open (latest) bucket's running sum.

    Performance: the recorder adds each step's service straight into a name's open bucket
    (``add``: native fields, one dict lookup per name and step, nothing copied when a bucket
    closes); the sums are the same floats as adding into a dict entry from 0.0."""

    def __init__(self) -> None:
        self.buckets: array[int] = array("q")       # closed buckets, ascending
        self.values: array[float] = array("d")
        self.open_bucket = -1                       # > every closed bucket; -1: none yet
        self.open_value = 0.0

    def add(self, b: int, x: float) -> None:
        """``x`` more service in bucket ``b`` (the open one, or a later one, which opens)."""
        if b == self.open_bucket:
            self.open_value = self.open_value + x
        else:
            self._open(b)
            self.open_value = 0.0 + x

    def add_repeated(self, b: int, x: float, k: int) -> None:
        """``add(b, x)`` ``k`` times (``exactfloat.add_repeated``)."""
        if b != self.open_bucket:
            self._open(b)
            self.open_value = 0.0
        self.open_value = add_repeated(self.open_value, x, k)

    def _open(self, b: int) -> None:
        if self.open_bucket >= 0:
            self.buckets.append(self.open_bucket)
            self.values.append(self.open_value)
        self.open_bucket = b

    def to_dict(self) -> dict[int, float]:
        out = dict(zip(self.buckets.tolist(), self.values.tolist()))
        if self.open_bucket >= 0:
            out[self.open_bucket] = self.open_value
        return out


def _series(series: dict[str, Series], name: str) -> Series:
    """``name``'s series, new (last in first-served order) on its first service."""
    s = series.get(name)
    if s is None:
        s = series[name] = Series()
    return s


class Recorder:
    # record_run reads each step's end and duration (False: record_steps counts them instead)
    reads_steps: ClassVar[bool] = True

    def __init__(self, costs: CostWeights, bucket_s: float = 1.0) -> None:
        self.costs = costs
        self.bucket_s = bucket_s
        self.tenant_service: dict[str, Series] = {}      # first-served order
        self.class_service: dict[str, Series] = {}
        self.tokens: dict[int, int] = defaultdict(int)       # bucket -> tokens processed
        self.queue_len: dict[int, int] = {}
        self.running: dict[int, int] = {}
        self.kv_usage: dict[int, float] = {}
        self.preemptions: list[tuple[float, str, str, str]] = []   # (t, request_id, tenant, mode)
        self.num_steps = 0
        self.busy_s = 0.0
        # integer cost weights keep every service sum integer-valued: k equal additions are
        # then exactly one multiplication (sums stay far below 2**53)
        self._integral = float(costs.prefill_token).is_integer() and float(costs.decode_token).is_integer()
        self._wp, self._wd = costs.prefill_token, costs.decode_token
        # the open bucket and its tokens, summed here in the order record_* adds them and
        # written into ``tokens`` when the bucket changes (time never goes back) or on to_json
        # (each name's service sums into its Series' own open bucket)
        self._open = -1
        self._open_tokens = 0

    def _bucket(self, b: int) -> None:
        """Make ``b`` the open bucket: O(1)."""
        if b != self._open:
            if b < self._open:
                raise ValueError(f"recorder: time went back from bucket {self._open} to {b}")
            self._flush()
            self._open, self._open_tokens = b, 0

    def _flush(self) -> None:
        if self._open >= 0:
            self.tokens[self._open] = self._open_tokens

    def record_step(self, out: SchedulerOutput, t_end: float, duration_s: float,
                    num_waiting: int, num_running: int, kv_usage: float) -> None:
        b = int(t_end // self.bucket_s)
        self._bucket(b)
        wp, wd = self._wp, self._wd
        ts, cs = self.tenant_service, self.class_service
        n_tokens = 0
        for req, n in out.prefill:
            c = wp * n
            _series(ts, req.tenant).add(b, c)
            _series(cs, req.klass).add(b, c)
            n_tokens += n
        tenants, classes = out.decode_counts or count_by_tenant_and_class(out.decode)
        for name, cnt in tenants.items():
            _series(ts, name).add(b, wd * cnt)
        for name, cnt in classes.items():
            _series(cs, name).add(b, wd * cnt)
        n_tokens += len(out.decode)
        self._open_tokens += n_tokens
        for req, mode in out.preempted:
            self.preemptions.append((t_end - duration_s, req.request_id, req.tenant, mode))
        self.queue_len[b] = num_waiting
        self.running[b] = num_running
        self.kv_usage[b] = kv_usage
        self.num_steps += 1
        self.busy_s += duration_s

    def record_steps(self, num_steps: int) -> None:
        """Only for a recorder whose ``reads_steps`` is False (runtime/step_counter.py)."""
        raise TypeError("this recorder reads each step's end and duration: call record_run")

    def record_run(self, tenants: dict[str, int], classes: dict[str, int], step_ends: list[float],
                   step_durations: list[float], usage_after: Callable[[int], float],
                   running_after: int) -> None:
        """A fast-forwarded run of decode-only steps (no prefill, no queue, no preemption) with
        ``tenants`` / ``classes`` decoding requests per name in every step: the buckets end up
        bit for bit as ``record_step`` once per step would leave them.  ``usage_after(j)`` is
        the KV usage after step j; ``running_after`` the running count after the last step
        (the others run ``sum(tenants.values())``).  O(buckets x names + k), plus O(k) per
        name when a service sum is not integer-valued (``add_repeated``)."""
        wd = self._wd
        bucket_s = self.bucket_s
        n = sum(tenants.values())
        last = len(step_ends) - 1
        i = 0
        while i <= last:
            b = int(step_ends[i] // bucket_s)
            j = i
            while j < last and int(step_ends[j + 1] // bucket_s) == b:
                j += 1
            k = j - i + 1
            self._bucket(b)
            for counts, service in ((tenants, self.tenant_service), (classes, self.class_service)):
                for name, cnt in counts.items():
                    if self._integral:
                        _series(service, name).add(b, wd * cnt * k)
                    else:
                        _series(service, name).add_repeated(b, wd * cnt, k)
            self._open_tokens += n * k
            self.queue_len[b] = 0
            self.running[b] = n if j < last else running_after
            self.kv_usage[b] = usage_after(j)
            i = j + 1
        busy_s = self.busy_s
        for dt in step_durations:
            busy_s += dt
        self.busy_s = busy_s
        self.num_steps += len(step_ends)

    def to_json(self) -> dict[str, object]:
        self._flush()                   # the open bucket as it stands (it may still grow)
        return {
            "bucket_s": self.bucket_s,
            "tenant_service": {t: v.to_dict() for t, v in self.tenant_service.items()},
            "class_service": {c: v.to_dict() for c, v in self.class_service.items()},
            "tokens": dict(sorted(self.tokens.items())),
            "queue_len": self.queue_len,
            "running": self.running,
            "kv_usage": self.kv_usage,
            "preemptions": self.preemptions,
            "num_steps": self.num_steps,
            "busy_s": self.busy_s,
        }

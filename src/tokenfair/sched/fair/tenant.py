"""Per-tenant scheduling state shared by the fair policy's layers."""

from __future__ import annotations

import math
from typing import Final

from ...contracts.contract import ClassSpec, TenantSpec
from ...core.request import Request
from .arrivals import ArrivalCosts
from .ordering import LazyHeap

PEAK_TAU_S: Final = 60.0          # time constant of the decayed KV and slot peaks (note_peak), s


class TenantState:
    __slots__ = ("name", "seq", "spec", "weight", "vtime", "num_waiting", "running", "bucket",
                 "bucket_t", "recent", "recent_t", "queued_cost", "queues", "arrivals", "backlogged_since", "starved_since", "starve_stamp", "kv_peak", "slots_peak", "peak_t", "head_cost", "stamp", "active", "admitted", "admitted_t", "admitted_by_class", "held")

    def __init__(self, name: str, spec: TenantSpec, now: float, seq: int = 0, *,
                 held: dict[str, int]) -> None:
        self.name = name
        self.held = held            # the KV pool's tenant -> device blocks (BlockPool.held)
        self.seq = seq              # first-seen order: the last element of every tenant ordering key
        self.spec = spec
        self.weight = spec.weight
        self.vtime = 0.0            # normalised service S_i (cost / weight), see wfq.py
        self.head_cost = 0.0        # predicted cost of its next request (for finish tags)
        self.admitted = 0.0         # decayed predicted cost of its admissions (queue drain)
        self.admitted_t = now
        self.admitted_by_class: dict[str, float] = {}   # class -> its part of ``admitted``
        self.active = False         # has waiting or running requests
        self.stamp = 0              # bumped on every re-key in the WFQ heap
        self.num_waiting = 0
        self.running: set[Request] = set()
        self.bucket = spec.rate_limit.burst_tokens if spec.rate_limit else 0.0
        self.bucket_t = now
        self.recent = 0.0           # exponentially decayed service (decayed lazily to recent_t)
        self.recent_t = now
        self.queued_cost: dict[str, float] = {}   # class -> predicted cost of its waiting requests
        self.queues: dict[str, LazyHeap] = {}     # class -> its waiting requests (ordering.py)
        self.arrivals: dict[str, ArrivalCosts] = {}   # class -> their costs in arrival order
        self.backlogged_since = now  # since when it has had waiting requests (when it has)
        self.starved_since = math.inf  # since when it has waited with nothing running (inf: not)
        self.starve_stamp = 0        # bumped when a starving spell starts or ends (guarantee.py)
        self.kv_peak = 0.0          # decayed peak of KV blocks held (+ the next admission)
        self.slots_peak = 0.0       # decayed peak of running requests
        self.peak_t = now

    def note_peak(self, now: float, blocks: int, slots: int, tau_s: float) -> None:
        if now > self.peak_t:
            f = math.exp(-(now - self.peak_t) / tau_s)
            self.kv_peak *= f
            self.slots_peak *= f
            self.peak_t = now
        self.kv_peak = max(self.kv_peak, blocks)
        self.slots_peak = max(self.slots_peak, slots)

    def decayed_recent(self, now: float, tau_s: float) -> float:
        if now > self.recent_t:
            self.recent *= math.exp(-(now - self.recent_t) / tau_s)
            self.recent_t = now
        return self.recent

    def recent_at(self, now: float, tau_s: float) -> float:
        """``decayed_recent(now, tau_s)``'s value, nothing written (a read-only view)."""
        if now > self.recent_t:
            return self.recent * math.exp(-(now - self.recent_t) / tau_s)
        return self.recent

    def decayed_admitted(self, now: float, tau_s: float) -> float:
        if now > self.admitted_t:
            f = math.exp(-(now - self.admitted_t) / tau_s)
            self.admitted *= f
            by_class = self.admitted_by_class
            for k in by_class:
                by_class[k] *= f
            self.admitted_t = now
        return self.admitted

    def add_admitted(self, klass: str, cost: float, now: float, tau_s: float) -> None:
        """An admission of ``cost`` predicted cost in class ``klass`` (O(classes))."""
        self.decayed_admitted(now, tau_s)
        self.admitted += cost
        self.admitted_by_class[klass] = self.admitted_by_class.get(klass, 0.0) + cost

    def admitted_above(self, priority: float, classes: dict[str, ClassSpec]) -> float:
        """The part of ``admitted`` (as last decayed) in classes of a base priority above
        ``priority``: what its later arrivals in those classes take ahead of a waiting
        request of that priority (O(classes))."""
        return sum(c for k, c in self.admitted_by_class.items()
                   if k in classes and classes[k].priority > priority)

    def queued_ahead(self, priority: float, classes: dict[str, ClassSpec]) -> float:
        """Predicted cost queued in classes whose base priority is at least ``priority``:
        what a new request of that priority waits behind (O(classes))."""
        return sum(c for k, c in self.queued_cost.items()
                   if k not in classes or classes[k].priority >= priority)

    def kv_blocks(self) -> int:
        """Device KV blocks of its running requests: O(1), kept by the pool."""
        return self.held.get(self.name, 0)

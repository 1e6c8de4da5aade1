"""A canary of a contract change: apply B, watch the live figures, roll back by itself on a breach.

``POST /admin/contract?canary_s=300[&eval_s=10]`` applies the candidate as a normal live
change (:mod:`tokenfair.serve.contract_live`) and then, every ``eval_s`` seconds (default
``min(30, canary_s / 5)``), evaluates the requests the candidate admitted so far against the
thresholds' ``live`` gate (:func:`tokenfair.evaluation.thresholds.evaluate`): per-tenant and per-class
P99 TTFT and starvation, the rejection rate (429s and other refusals) and the SLO goodput
fraction.  A request still queued past its class's ``max_wait_s`` counts as a starvation
event at once, without waiting for it to end.  On the first breach the previous contract is
restored (``rollback`` event, the breached checks named in its reason), so a breach is acted
on within one evaluation period.  When ``canary_s`` passes without a breach the candidate
stays (``canary_passed``).  Another change (apply, reload, rollback) ends the canary.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from ..contracts.contract import Contract
from ..evaluation.measured import measured_summary
from ..core.request import Status
from ..evaluation.thresholds import Check, GateSpec, evaluate
from .contract_live import LiveContract, label_of

MAX_DEFAULT_EVAL_S = 30.0
MIN_EVAL_S = 0.05


class Canary:
    def __init__(self, live: LiveContract, candidate: Contract, canary_s: float, gate: GateSpec,
                 eval_s: float | None = None) -> None:
        if canary_s <= 0:
            raise ValueError(f"canary_s must be > 0 seconds, got {canary_s:g}")
        if eval_s is not None and eval_s < MIN_EVAL_S:
            raise ValueError(f"eval_s must be >= {MIN_EVAL_S} seconds, got {eval_s:g}")
        self.live = live
        self.candidate = candidate
        self.canary_s = canary_s
        self.eval_s = eval_s if eval_s is not None else min(MAX_DEFAULT_EVAL_S, canary_s / 5)
        self.gate = gate
        self.state = "pending"          # pending -> watching -> passed | rolled_back | superseded
        self.start_s = 0.0
        self.last_checks: list[Check] = []
        self.num_evaluations = 0
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        """Apply the candidate and start watching (call on the service's event loop)."""
        svc = self.live.service
        self.live.apply(self.candidate, "canary", f"canary for {self.canary_s:g}s, evaluated every {self.eval_s:g}s")
        self.start_s = svc.now()
        self.state = "watching"
        self.live.canary = self
        self.task = asyncio.ensure_future(self._watch())

    def stop(self, state: str = "superseded") -> None:
        if self.state == "watching":
            self.state = state
        if self.task is not None and not self.task.done() and self.task is not asyncio.current_task():
            self.task.cancel()
        if self.live.canary is self:
            self.live.canary = None

    def evaluate(self) -> list[Check]:
        svc = self.live.service
        digest = self.candidate.content_hash
        recs = [r for r in list(svc.records.items)
                if r.get("contract_hash") == digest and r["arrival_s"] >= self.start_s]
        now = svc.now()
        starving: dict[tuple[str, str], int] = defaultdict(int)
        for job in list(getattr(svc, "jobs", {}).values()):
            req = job.req
            if (req.status is Status.WAITING and req.max_wait_s is not None and req.arrival_s >= self.start_s
                    and now - req.arrival_s > req.max_wait_s):
                starving[(req.tenant, req.klass)] += 1
        self.num_evaluations += 1
        self.last_checks = evaluate(measured_summary(recs, starving), self.gate)
        return self.last_checks

    async def _watch(self) -> None:
        svc = self.live.service
        end = self.start_s + self.canary_s
        while self.state == "watching":
            await asyncio.sleep(max(MIN_EVAL_S, min(self.eval_s, end - svc.now())))
            if self.state != "watching":
                return
            breached = [c for c in self.evaluate() if not c.passed]
            if breached:
                names = ", ".join(f"{c.name}={'n/a' if c.value is None else f'{c.value:.4g}'} (limit {c.op} {c.limit:g})"
                                  for c in breached)
                self.state = "rolled_back"
                self.live.canary = None
                self.live.rollback(f"canary breach of {label_of(self.candidate)}: {names}")
                return
            if svc.now() >= end:
                self.state = "passed"
                self.live.canary = None
                self.live.note("canary_passed", f"{label_of(self.candidate)} held {self.canary_s:g}s "
                                                f"({self.num_evaluations} evaluations, no breach)")
                return

    def status(self) -> dict:
        return {"candidate": label_of(self.candidate), "state": self.state, "canary_s": self.canary_s,
                "eval_s": self.eval_s, "evaluations": self.num_evaluations,
                "breached": [c.name for c in self.last_checks if not c.passed]}

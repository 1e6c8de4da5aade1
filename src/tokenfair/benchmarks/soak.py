"""A fault-injecting soak of the scheduler driven as ``serve`` drives it (simulated engine).

Each simulated request arrives as a trace record (a dict, validated by
``workload.row_from_mapping`` as a request body is by the HTTP layer), is admitted by the
contract and the scheduler, and runs on the simulator's engine wrapped in
:class:`FaultyEngine`.  Faults, each drawn from one seeded ``random.Random``:

  * malformed records (a missing field, a negative token count, a non-number): refused at
    intake, ``rejected: invalid_row: ...``; records the contract refuses (an unknown class)
    or that can never fit the KV pool are refused with the contract's reason;
  * a poisoned request in a step (``request_fault``): that request fails alone, the step's
    others proceed -- what ``serve`` does after isolating a failing step;
  * a whole failing step (``engine_error``): every request of that step fails;
  * client cancellations: a waiting request is aborted at once, a running one right before
    the next step (``client_disconnected``), as ``serve`` applies them.

Checked while it runs: the scheduler's KV/slot invariants after every step
(``IterationScheduler.check_invariants``); every request ends exactly once with a non-empty
reason; nothing is held after the run (no running, no waiting, the engine forgot everyone).
Memory: requests are dropped when they end, so what is held is the requests in the system;
:class:`SoakReport` gives the largest number held and the process's peak RSS.
"""

from __future__ import annotations

import random
import resource
import time
from collections import Counter
from dataclasses import dataclass, field

from ..contracts.contract import Contract, parse_contract
from ..core.costmodel import load_profile
from ..runtime.intake import make_request
from ..core.reasons import NEVER_ADMITTED, Reason, ReasonCode
from ..core.request import Request, Status
from ..sched.interface import SchedulerOutput, StepResult
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from ..sim.engine import SimEngine
from ..workloads.workload import WorkloadError, row_from_mapping

DISCONNECT = Reason(ReasonCode.CLIENT_DISCONNECTED, "the client closed the connection (injected)")
TENANTS = ("acme", "globex", "initech", "umbrella")


@dataclass(frozen=True)
class SoakConfig:
    num_requests: int = 10_000
    seed: int = 0
    policy: str = "fair"
    rate_per_s: float = 2.0            # arrivals per simulated second (near what the pool serves)
    p_malformed: float = 0.01          # per record
    p_bad_class: float = 0.005         # per record: a class the tenant may not use
    p_poison: float = 0.002            # per step: one request of the step fails alone
    p_step_failure: float = 0.0005     # per step: every request of the step fails
    p_cancel: float = 0.01             # per arrival: a random live request is cancelled
    profile: str = "vtc-a10g-llama2-7b"


@dataclass
class SoakReport:
    num_requests: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_code: Counter = field(default_factory=Counter)      # reason code of every non-finished end
    num_steps: int = 0
    num_invariant_checks: int = 0
    max_live: int = 0                  # requests in the system at once (admitted, not ended)
    peak_rss_mb: float = 0.0
    wall_s: float = 0.0
    sim_s: float = 0.0

    def as_dict(self) -> dict:
        return {"requests": self.num_requests, "by_status": dict(self.by_status), "by_code": dict(self.by_code),
                "steps": self.num_steps, "invariant_checks": self.num_invariant_checks, "max_live": self.max_live,
                "peak_rss_mb": round(self.peak_rss_mb, 1), "wall_s": round(self.wall_s, 1),
                "simulated_s": round(self.sim_s, 1)}


class FaultyEngine:
    """The simulator's engine with injected request faults and step failures."""

    def __init__(self, engine: SimEngine, rng: random.Random, p_poison: float, p_step_failure: float) -> None:
        self.engine = engine
        self.rng = rng
        self.p_poison, self.p_step_failure = p_poison, p_step_failure

    def execute(self, out: SchedulerOutput) -> StepResult:
        res = self.engine.execute(out)
        in_step = [r for r, _ in out.prefill] + list(out.decode)
        if not in_step:
            return res
        draw = self.rng.random()
        if draw < self.p_step_failure:
            failed = [(r, Reason(ReasonCode.ENGINE_ERROR, "injected step failure")) for r in in_step]
        elif draw < self.p_step_failure + self.p_poison:
            failed = [(self.rng.choice(in_step), Reason(ReasonCode.REQUEST_FAULT, "injected poisoned request"))]
        else:
            return res
        gone = {id(r) for r, _ in failed}
        for r, _ in failed:
            self.engine.forget(r)
        return StepResult(duration_s=res.duration_s, finished=[r for r in res.finished if id(r) not in gone],
                          failed=failed, swap_s=res.swap_s)


def soak_contract() -> Contract:
    tenants = {t: {"weight": w, "max_queued": 200} for t, w in zip(TENANTS, (1, 1, 2, 1))}
    tenants["umbrella"]["classes"] = ["batch"]
    tenants["umbrella"]["default_class"] = "batch"
    return parse_contract({"version": "soak", "tenants": tenants})


def _record(i: int, rng: random.Random, now: float, cfg: SoakConfig) -> dict:
    d: dict = {"request_id": f"r{i}", "arrival_s": now, "tenant": rng.choice(TENANTS),
               "prompt_tokens": rng.randint(8, 1024), "output_tokens": rng.randint(1, 200)}
    u = rng.random()
    if u < cfg.p_malformed:
        bad = rng.choice(("prompt_tokens", "output_tokens", "arrival_s", "tenant", "extra"))
        if bad == "extra":
            d["temperature_typo"] = 1
        elif bad == "tenant":
            del d["tenant"]
        else:
            d[bad] = rng.choice((-5, "many", None, True))
    elif u < cfg.p_malformed + cfg.p_bad_class:
        d["class"] = "realtime"            # umbrella may not; others: an allowed class
    return d


class _Soak:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.contract = soak_contract()
        prof = load_profile(cfg.profile)
        self.sched = IterationScheduler(make_policy(cfg.policy), self.contract, prof)
        self.sim = SimEngine(prof)
        self.engine = FaultyEngine(self.sim, self.rng, cfg.p_poison, cfg.p_step_failure)
        self.capacity_tokens = self.sched.pool.num_blocks * self.sched.pool.block_size
        self.ended = bytearray(cfg.num_requests)        # 1: request i reached a terminal state
        self.live: dict[int, Request] = {}
        self.cancel_running: list[Request] = []
        self.rep = SoakReport(num_requests=cfg.num_requests)

    def end(self, i: int, status: Status, reason: Reason | None) -> None:
        assert not self.ended[i], f"request {i} ended twice"
        assert reason is not None, f"request {i} ended without a reason"
        self.ended[i] = 1
        self.rep.by_status[status.value] += 1
        if status is not Status.FINISHED:
            self.rep.by_code[reason.code.value] += 1

    def collect(self, reqs: list[Request]) -> None:
        for req in reqs:
            i = req.seq
            if self.live.pop(i, None) is None:
                continue                                   # already counted (never happens twice)
            self.end(i, req.status, req.end_reason)
            self.sim.forget(req)

    def arrive(self, i: int, now: float) -> None:
        try:
            row = row_from_mapping(_record(i, self.rng, now, self.cfg), f"record {i}")
        except WorkloadError as err:
            self.end(i, Status.REJECTED, Reason(ReasonCode.INVALID_ROW, str(err)))
            return
        req, reject = make_request(row, i, self.contract)
        if reject is None and row.prompt_tokens + 1 > self.capacity_tokens:
            reject = Reason(ReasonCode.PROMPT_EXCEEDS_KV_CAPACITY)
        if reject is not None:
            self.end(i, Status.REJECTED, reject)
            return
        self.sim.add(req, row.output_tokens)
        self.live[i] = req
        self.sched.add_request(req, now)
        if self.live and self.rng.random() < self.cfg.p_cancel:
            self.cancel(now)

    def cancel(self, now: float) -> None:
        victim = self.live[self.rng.choice(list(self.live))]
        if victim.status.is_terminal:
            return
        if victim.status is Status.RUNNING:
            self.cancel_running.append(victim)            # applied before the next step
        else:
            self.sched.abort(victim, Status.FAILED, DISCONNECT, now)

    def step(self, now: float, next_arrival: float) -> float:
        sched = self.sched
        for req in self.cancel_running:
            sched.abort(req, Status.FAILED, DISCONNECT, now)
        self.cancel_running.clear()
        self.collect(self._drain())
        if not sched.has_work():
            return next_arrival
        out = sched.schedule(now)
        if out.is_empty and not out.preempted:
            self.collect(out.aborted + self._drain())
            wake = min(sched.policy_wakeup(now), next_arrival)
            if wake == float("inf"):
                sched.fail_waiting(NEVER_ADMITTED, now)
                self.collect(self._drain())
                return now
            return max(now, wake)
        result = self.engine.execute(out)
        now += result.duration_s
        self.collect(sched.update_from_output(out, result, now))
        sched.check_invariants()
        self.rep.num_invariant_checks += 1
        self.rep.num_steps += 1
        self.rep.max_live = max(self.rep.max_live, len(self.live))
        return now

    def _drain(self) -> list[Request]:
        ended = self.sched.take_ended()
        return ended

    def run(self, progress=None, every: int = 100_000) -> SoakReport:
        """``progress(arrived, report)`` is called every ``every`` arrivals."""
        t0 = time.perf_counter()
        now, i, n = 0.0, 0, self.cfg.num_requests
        next_arrival = self.rng.expovariate(self.cfg.rate_per_s)
        while i < n or self.live:
            while i < n and next_arrival <= now:
                self.arrive(i, next_arrival)
                i += 1
                if progress is not None and i % every == 0:
                    self.rep.wall_s = time.perf_counter() - t0
                    progress(i, self.rep)
                next_arrival += self.rng.expovariate(self.cfg.rate_per_s)
            now = self.step(now, next_arrival if i < n else float("inf"))
        self.check_empty()
        self.rep.wall_s = time.perf_counter() - t0
        self.rep.sim_s = now
        self.rep.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return self.rep

    def check_empty(self) -> None:
        assert all(self.ended), f"{self.ended.count(0)} requests never ended"
        assert sum(self.rep.by_status.values()) == self.cfg.num_requests
        assert not self.sched.running and self.sched.policy.num_waiting() == 0
        assert self.sched.pool.num_free == self.sched.pool.num_blocks and self.sched.pool.host_used == 0
        assert not self.sim.true_lengths and not self.sim.stop_at, "the engine still holds requests"


def run_soak(cfg: SoakConfig, progress=None) -> SoakReport:
    """Run the soak; raises AssertionError at the first broken invariant."""
    return _Soak(cfg).run(progress)

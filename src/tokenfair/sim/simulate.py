"""``simulate``: one policy on one workload in the simulator, with isolated baselines."""

from __future__ import annotations

from dataclasses import dataclass

from ..contract import Contract
from ..costmodel import Profile
from ..loop import RunResult, VirtualClock, run
from ..metrics import group_metrics, request_record, summarize
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from ..request import Request
from ..sched.interface import SchedulerOutput, StepResult
from ..workload import TraceRow, Workload
from .engine import SimEngine
from .fastforward import fast_forward
from .isolated import isolated_e2e


@dataclass
class SimOutput:
    records: list[dict]
    summary: dict
    timeline: dict
    run: RunResult


class _RowFedEngine:
    """The simulator's engine as the loop drives it: ``add`` takes the trace row (the true
    output length stays on the engine side); the fast-forward's fields pass through."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.true_lengths = engine.true_lengths
        self.stop_at = engine.stop_at
        self.decode_step_s = engine.decode_step_s
        self.profile = engine.profile

    def add(self, req: Request, row: TraceRow) -> None:
        self.engine.add(req, row.output_tokens)

    def execute(self, out: SchedulerOutput) -> StepResult:
        return self.engine.execute(out)

    def forget(self, req: Request) -> None:
        self.engine.forget(req)

    def advance(self, durations: list[float]) -> None:
        self.engine.advance(durations)


def simulate_once(workload: Workload, policy: str, contract: Contract, profile: Profile,
                  progress=None, fast: bool = True) -> RunResult:
    sched = IterationScheduler(make_policy(policy), contract, profile)
    engine = SimEngine(profile)

    res = run(workload.rows, contract, sched, _RowFedEngine(engine), VirtualClock(), progress,
              fast_forward=fast_forward if fast else None)
    res.extra["swap_s"] = engine.swap_s
    return res


def simulate(workload: Workload, policy: str, contract: Contract, profile: Profile, *,
             isolated: bool = True, max_isolated_tenants: int = 32, progress=None) -> SimOutput:
    res = simulate_once(workload, policy, contract, profile, progress)
    records = [request_record(r) for r in res.requests]
    timeline = res.recorder.to_json()
    timeline["swap_s"] = res.extra.get("swap_s", 0.0)
    iso_req = iso_ten = None
    if isolated:
        chunk = min(res.scheduler.policy.max_chunk(), contract.engine.prefill_token_budget
                    + (contract.engine.decode_token_budget if res.scheduler.policy.shared_budget else 0))
        iso_req = isolated_e2e(workload.rows, contract, profile, chunk)
        tenants = sorted(workload.tenants, key=lambda t: sum(1 for r in workload.rows if r.tenant == t))
        iso_ten = {}
        if len(tenants) > 1:
            for t in tenants[:max_isolated_tenants]:
                alone = simulate_once(workload.only_tenant(t), policy, contract, profile)
                iso_ten[t] = group_metrics([request_record(r) for r in alone.requests], None)
    summary = summarize(records, timeline, contract, iso_req, iso_ten)
    summary.update({"policy": policy, "profile": profile.name, "workload": workload.name,
                    **contract.identity(), "sim_wall_s": res.wall_s,
                    "predictor": res.scheduler.predictor.report()})
    return SimOutput(records, summary, timeline, res)

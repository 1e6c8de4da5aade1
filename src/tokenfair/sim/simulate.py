"""``simulate``: one policy on one workload in the simulator, with isolated baselines.

The isolated baselines run on one reference scheduler, whatever the run's policy:
``REFERENCE_POLICY``, vLLM V1's default (``sched/baselines/fifo.py``: arrival order, chunked
prefill capped only by the shared token budget).  Every policy's slowdown is then measured
against the same runs, and no policy is flattered by its own runs alone being slow (the fair
policy's prefill chunks of ``chunk_size`` beside decodes would split a tenant's prompt over
more steps alone than the engine needs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Final

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..runtime.loop import RunResult, VirtualClock, run
from ..runtime.recorder import Recorder
from ..runtime.step_counter import StepCounter
from ..evaluation.metrics import group_metrics, summarize
from ..evaluation.record_table import RecordTable
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from ..workloads.gc_pause import gc_paused
from ..workloads.workload import TraceRow, Workload
from .engine import RowFedEngine, SimEngine
from .fastforward import fast_forward
from .isolated import isolated_e2e

# the scheduler of the isolated baselines (module docstring)
REFERENCE_POLICY: Final = "fifo"

# (each request's isolated e2e, each tenant's isolated metrics): isolated_baselines' answer
Baselines = tuple[dict[str, float], dict[str, dict[str, Any]]]


@dataclass
class SimOutput:
    table: RecordTable  # the per-request records, as columns
    summary: dict[str, Any]
    timeline: dict[str, Any]
    run: Any            # loop.RunResult, or sim.fleet.FleetRun for a fleet run
    _records: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records as dicts (``metrics.request_record``'s), made on first use."""
        if self._records is None:
            self._records = self.table.rows()
        return self._records


def simulate_once(workload: Workload, policy: str, contract: Contract, profile: Profile,
                  progress: Callable[[int, int], None] | None = None, fast: bool = True,
                  timeline: bool = True) -> RunResult:
    """One run.  ``timeline=False``: no timeline is recorded (the recorder only counts steps);
    the requests end the same."""
    sched = IterationScheduler(make_policy(policy), contract, profile)
    engine = SimEngine(profile)
    recorder = Recorder(contract.costs) if timeline else StepCounter(contract.costs)
    res = run(workload.rows, contract, sched, RowFedEngine(engine), VirtualClock(), progress,
              fast_forward=fast_forward if fast else None, recorder=recorder)
    res.extra["swap_s"] = engine.swap_s
    return res


def simulate(workload: Workload, policy: str, contract: Contract, profile: Profile, *,
             isolated: bool = True, max_isolated_tenants: int = 32,
             progress: Callable[[int, int], None] | None = None,
             baselines: Baselines | None = None) -> SimOutput:
    """One run with its summary.  ``baselines``: :func:`isolated_baselines`' answer for this
    workload, contract and profile, when the caller has it (they do not depend on ``policy``:
    a comparison of policies computes them once); None: computed here if ``isolated``."""
    # performance: the collector paused while the runs go (the run and the tenant-alone runs
    # of the isolated baselines), as in the fleet loop (sim/fleet.py): about one Request and a
    # few containers per row that live to the end and no reference cycles to speak of, so
    # its passes would only trace them again and again
    with gc_paused():
        res = simulate_once(workload, policy, contract, profile, progress)
        records = RecordTable.from_requests(res.requests)
        timeline = res.recorder.to_json()
        timeline["swap_s"] = res.extra.get("swap_s", 0.0)
        summary = run_summary(workload, policy, contract, profile, records, timeline, res.scheduler,
                              res.wall_s, isolated, max_isolated_tenants, baselines)
    return SimOutput(records, summary, timeline, res)


def run_summary(workload: Workload, policy: str, contract: Contract, profile: Profile,
                records: RecordTable | list[dict[str, Any]], timeline: dict[str, Any], sched: IterationScheduler,
                wall_s: float, isolated: bool, max_isolated_tenants: int,
                baselines: Baselines | None = None) -> dict[str, Any]:
    """summary.json for a run's records and timeline: metrics, isolated baselines when asked
    (``sched``: the run's scheduler -- its predictor's report; ``baselines``: the isolated
    baselines already computed, else computed here)."""
    iso_req = iso_ten = None
    if isolated:
        iso_req, iso_ten = baselines if baselines is not None else isolated_baselines(
            workload, contract, profile, max_isolated_tenants)
    summary = summarize(records, timeline, contract, iso_req, iso_ten)
    summary.update({"policy": policy, "profile": profile.name, "workload": workload.name,
                    **contract.identity(), "sim_wall_s": wall_s,
                    "predictor": sched.predictor.report()})
    return summary


def reference_chunk(contract: Contract) -> int:
    """The reference scheduler's largest prefill chunk: its whole shared token budget."""
    return contract.engine.prefill_token_budget + contract.engine.decode_token_budget


def isolated_baselines(workload: Workload, contract: Contract, profile: Profile,
                       max_isolated_tenants: int = 32) -> Baselines:
    """(each request's e2e alone on an empty engine, each tenant's metrics with its traffic
    alone: the ``max_isolated_tenants`` smallest tenants, when there are two or more), both
    on ``REFERENCE_POLICY`` (module docstring).  A prompt that never fits the profile's KV
    pool (every run's: ``IterationScheduler``) gets no baseline."""
    pool_tokens = profile.num_blocks * profile.block_size
    iso_req = isolated_e2e(workload.rows, contract, profile, reference_chunk(contract), pool_tokens)
    rows_of: dict[str, list[TraceRow]] = {}
    for r in workload.rows:
        rows_of.setdefault(r.tenant, []).append(r)
    tenants = sorted(sorted(rows_of), key=lambda t: len(rows_of[t]))    # by volume, then name
    iso_ten: dict[str, dict[str, Any]] = {}
    if len(tenants) > 1:
        for t in tenants[:max_isolated_tenants]:
            # the tenant's rows in trace order, as Workload.only_tenant gives them
            alone = simulate_once(Workload(f"{workload.name}[{t}]", tuple(rows_of[t])), REFERENCE_POLICY,
                                  contract, profile, timeline=False)
            # the records as columns, as the shared run's (performance: no dict per request)
            iso_ten[t] = group_metrics(RecordTable.from_requests(alone.requests), None)
    return iso_req, iso_ten

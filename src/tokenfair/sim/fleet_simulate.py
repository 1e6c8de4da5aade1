"""``simulate_fleet``: one policy per replica on a fleet, with isolated baselines and the
fleet's per-replica summary (what ``tokenfair simulate --replicas N`` writes)."""

from __future__ import annotations

from typing import Callable

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..workloads.workload import Workload
from .fleet import FleetConfig, simulate_fleet_once
from .fleet_metrics import fleet_records, fleet_summary, fleet_timeline
from .simulate import SimOutput, run_summary


def simulate_fleet(workload: Workload, policy: str, contract: Contract, profile: Profile,
                   config: FleetConfig, *, isolated: bool = True, max_isolated_tenants: int = 32,
                   progress: Callable[[int, int], None] | None = None) -> SimOutput:
    """Isolated baselines are the single-engine ones: each request alone on one empty
    replica, each tenant's traffic alone on one replica, both on the reference scheduler
    (``simulate.REFERENCE_POLICY``) whatever ``policy`` is.  The returned
    run's ``requests`` is empty: once their records are taken the Request objects are let
    go (at a million requests, about 300 MB)."""
    run = simulate_fleet_once(workload, policy, contract, profile, config, progress)
    records = fleet_records(run)
    run.requests.clear()            # the records hold what they said; nothing reads them after
    timeline = fleet_timeline(run)
    summary = run_summary(workload, policy, contract, profile, records, timeline, run.scheduler, run.wall_s,
                          isolated, max_isolated_tenants)
    summary["fleet"] = fleet_summary(run, config, summary["makespan_s"])
    return SimOutput(records, summary, timeline, run)

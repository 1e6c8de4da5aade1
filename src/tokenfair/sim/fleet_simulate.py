"""``simulate_fleet``: one policy per replica on a fleet, with isolated baselines and the
fleet's per-replica summary (what ``tokenfair simulate --replicas N`` writes)."""

from __future__ import annotations

from typing import Callable

from ..contract import Contract
from ..costmodel import Profile
from ..metrics import summarize
from ..workload import Workload
from .fleet import FleetConfig, simulate_fleet_once
from .fleet_metrics import fleet_records, fleet_summary, fleet_timeline
from .simulate import SimOutput, isolated_baselines


def simulate_fleet(workload: Workload, policy: str, contract: Contract, profile: Profile,
                   config: FleetConfig, *, isolated: bool = True, max_isolated_tenants: int = 32,
                   progress: Callable[[int, int], None] | None = None) -> SimOutput:
    """Isolated baselines are the single-engine ones: each request alone on one empty
    replica, each tenant's traffic alone on one replica under ``policy``."""
    run = simulate_fleet_once(workload, policy, contract, profile, config, progress)
    records = fleet_records(run)
    timeline = fleet_timeline(run)
    iso_req = iso_ten = None
    if isolated:
        iso_req, iso_ten = isolated_baselines(workload, policy, contract, profile, run.scheduler.policy,
                                              max_isolated_tenants)
    summary = summarize(records, timeline, contract, iso_req, iso_ten)
    summary.update({"policy": policy, "profile": profile.name, "workload": workload.name,
                    **contract.identity(), "sim_wall_s": run.wall_s,
                    "predictor": run.scheduler.predictor.report(),
                    "fleet": fleet_summary(run, config, summary["makespan_s"])})
    return SimOutput(records, summary, timeline, run)

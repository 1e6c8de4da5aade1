"""``tokenfair bench fleet-sim``: a fleet simulation in a fresh process -- the event loop alone,
then the whole command (reading, run, isolated baselines, metrics, files) -- with peak RSS.

The scale target: ``tokenfair bench fleet-sim azure:conv --replicas 64 --tenants 1000
--min-requests 1000000`` (the trace tiled in time and its rate scaled by the replica count,
so 64 replicas see about the load one sees on the plain trace).
"""

from __future__ import annotations

import resource
import time

from ..core_build import core_kind
from .bench import bench_workload, whole_command, run_child
from ..core.costmodel import load_profile


def _fleet_config(spec: dict):
    from ..sim.fleet import FleetConfig
    return FleetConfig(num_replicas=spec["replicas"], router=spec["router"], fleet_policy=spec["fleet_policy"],
                       prefix_cache=spec["prefix_cache"], gateway_window=spec.get("gateway_window"))


def _scaled(spec: dict):
    contract, wl = bench_workload(spec)
    if spec.get("rate_scale", 1.0) != 1.0:
        from ..workloads.traces import scale_rate
        wl = scale_rate(wl, spec["rate_scale"])
    return contract, wl


def fleet_child(spec: dict) -> dict:
    from ..sim.fleet import simulate_fleet_once
    from ..sim.fleet_simulate import simulate_fleet
    contract, wl = _scaled(spec)
    config = _fleet_config(spec)
    t0, c0 = time.perf_counter(), time.process_time()
    run = simulate_fleet_once(wl, spec["policy"], contract, load_profile(spec.get("profile")), config)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = sum(r.recorder.num_steps for r in run.replicas)
    n = len(wl.rows)
    out = {"policy": spec["policy"], "replicas": spec["replicas"], "router": spec["router"],
           "fleet_policy": spec["fleet_policy"], "requests": n, "tenants": len(wl.tenants),
           "wall_s": wall, "cpu_s": cpu, "requests_per_s": n / wall, "engine_steps": steps}
    del run, wl                     # the whole command reads its own workload
    if spec.get("whole", True):
        c1 = time.process_time()
        whole = whole_command(spec, lambda: _scaled(spec),
                               lambda w, c, p: simulate_fleet(w, spec["policy"], c, p, config))
        out.update({"whole_wall_s": whole, "whole_cpu_s": time.process_time() - c1,
                    "whole_requests_per_s": n / whole})
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out | {"peak_rss_mb": rss_mb, "core": core_kind()}


def bench_fleet(workload: str, policy: str, *, replicas: int, router: str = "round-robin",
                fleet_policy: str = "none", prefix_cache: bool = False, tenants: int | None = None,
                seed: int = 0, max_requests: int | None = None, min_requests: int | None = None,
                rate_scale: float = 1.0, whole: bool = True, profile: str | None = None) -> dict:
    spec = {"kind": "fleet", "workload": workload, "policy": policy, "replicas": replicas, "router": router,
            "fleet_policy": fleet_policy, "prefix_cache": prefix_cache, "tenants": tenants, "seed": seed,
            "max_requests": max_requests, "min_requests": min_requests, "rate_scale": rate_scale,
            "whole": whole, "profile": profile}
    return run_child(spec)

"""Benchmarks (not timed tests): scheduler overhead per iteration and simulator speed.

``bench_scheduler``: a steady decode state -- ``running`` requests decoding, ``waiting``
requests queued over ``tenants`` tenants, slots full -- then the median wall time of
``schedule()`` + ``update_from_output()`` over repeated iterations.
``bench_sim``: one simulation per policy, each in a fresh process (so peak RSS is its own),
reporting the loop's wall seconds and simulated requests per second, the whole command's
(reading, run, isolated baselines, metrics, files), and peak RSS; ``min_requests`` tiles
the trace in time first (the 1,000,000-request run).  ``bench_fleet`` (:mod:`.fleet_sim`):
the same for a fleet run.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Final

from ..core_build import core_kind
from ..contracts.contract import parse_contract
from ..core.costmodel import load_profile
from ..core.request import Request
from ..sched.interface import StepResult
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from ..sim.simulate import simulate, simulate_once

# a child's exit status for a user error (a bad workload or option): its stderr is the message
USER_ERROR_STATUS: Final = 2


def _steady_state(policy: str, running: int, waiting: int, tenants: int) -> IterationScheduler:
    contract = parse_contract({
        "default_tenant": {"weight": 1, "max_queued": 1_000_000},
        "engine": {"max_running": running, "decode_token_budget": running, "prefill_token_budget": 2048,
                   "chunk_size": 512},
        "admission": {"shed_over_max_wait": False},
    })
    sched = IterationScheduler(make_policy(policy), contract, load_profile(None))
    seq = 0
    now = 0.0
    for i in range(running):          # admit, prefill and start decoding `running` requests
        req = Request(f"r{seq}", seq, f"t{i % tenants}", "interactive", now, 128, 1_000_000)
        seq += 1
        sched.add_request(req, now)
    while any(r.in_prefill for r in sched.running) or len(sched.running) < running:
        out = sched.schedule(now)
        now += 0.01
        sched.update_from_output(out, StepResult(0.01), now)
    for i in range(waiting):
        req = Request(f"r{seq}", seq, f"t{i % tenants}", "interactive", now, 256, 1_000_000)
        seq += 1
        sched.add_request(req, now)
    return sched


def bench_scheduler(policy: str, running: int = 256, waiting: int = 10_000, tenants: int = 1_000,
                    iterations: int = 300, repeats: int = 3) -> dict:
    medians = []
    for _ in range(repeats):
        sched = _steady_state(policy, running, waiting, tenants)
        now = 1000.0
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            out = sched.schedule(now)
            now += 0.02
            sched.update_from_output(out, StepResult(0.02), now)
            times.append(time.perf_counter() - t0)
        assert len(out.decode) == running, "bench lost its steady decode state"
        medians.append(statistics.median(times))
    med = statistics.median(medians)
    return {"policy": policy, "running": running, "waiting": waiting, "tenants": tenants,
            "median_ms_per_iteration": med * 1e3, "us_per_running_request": med * 1e6 / running,
            "core": core_kind()}


def sim_child(spec: dict) -> dict:
    """The loop alone (``simulate_once``), then -- unless ``whole`` is false -- the whole
    command as ``tokenfair simulate`` runs it: reading the trace, the run, isolated baselines,
    metrics and the three files (into a temporary folder)."""
    contract, wl = bench_workload(spec)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate_once(wl, spec["policy"], contract, load_profile(spec.get("profile")))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"policy": spec["policy"], "requests": len(wl.rows), "wall_s": wall, "cpu_s": cpu,
           "requests_per_s": len(wl.rows) / wall, "engine_steps": res.recorder.num_steps}
    del res
    if spec.get("whole", True):
        c1 = time.process_time()
        whole = whole_command(spec, lambda: bench_workload(spec),
                               lambda wl, c, p: simulate(wl, spec["policy"], c, p))
        out.update({"whole_wall_s": whole, "whole_cpu_s": time.process_time() - c1,
                    "whole_requests_per_s": len(wl.rows) / whole})
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out | {"peak_rss_mb": rss_mb, "core": core_kind()}


def bench_workload(spec: dict):
    from ..cli.common import resolve_workload
    from ..workloads.traces import spread_tenants
    wl, contract = resolve_workload(spec["workload"], spec["seed"])
    if spec.get("min_requests"):
        from ..workloads.traces import tile
        wl = tile(wl, spec["min_requests"])
    if spec.get("tenants"):
        wl = spread_tenants(wl, spec["tenants"], seed=spec["seed"])
    if spec.get("max_requests"):
        from ..workloads.traces import limit
        wl = limit(wl, spec["max_requests"])
    return contract or parse_contract({}), wl


def whole_command(spec: dict, load, run) -> float:
    """Wall seconds of ``load()`` (reading: contract, workload) + ``run(workload, contract,
    profile)`` + writing the three files."""
    import tempfile
    from ..runtime.output import write_run
    t0 = time.perf_counter()
    contract, wl = load()
    out = run(wl, contract, load_profile(spec.get("profile")))
    with tempfile.TemporaryDirectory() as d:
        write_run(d, out.table, out.summary, out.timeline)
    return time.perf_counter() - t0


def bench_sim(workload: str, policy: str, *, tenants: int | None = 20, seed: int = 0,
              max_requests: int | None = None, min_requests: int | None = None,
              profile: str | None = None, whole: bool = True) -> dict:
    """One policy in a fresh process.  ``min_requests``: tile the trace in time (copies back
    to back, ``traces.tile``) until it has that many rows, e.g. 1,000,000."""
    spec = {"workload": workload, "policy": policy, "tenants": tenants, "seed": seed,
            "max_requests": max_requests, "min_requests": min_requests, "profile": profile, "whole": whole}
    out = run_child(spec)
    if whole and not min_requests:                # tiling has no command-line option
        out |= command_run(spec)
        out["command_requests_per_s"] = out["requests"] / out["command_wall_s"]
    return out


def command_run(spec: dict) -> dict:
    """``tokenfair simulate`` on ``spec`` as a user runs it, in its own process (interpreter
    start-up, imports and all): its wall and CPU seconds."""
    import tempfile
    args = [sys.executable, "-m", "tokenfair", "simulate", spec["workload"], "--policy", spec["policy"],
            "--seed", str(spec["seed"])]
    for option, key in (("--spread-tenants", "tenants"), ("--max-requests", "max_requests"), ("--profile", "profile")):
        if spec.get(key):
            args += [option, str(spec[key])]
    with tempfile.TemporaryDirectory() as d:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(args + ["--out", d], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"tokenfair simulate failed: {proc.stderr.strip()[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"command_wall_s": wall, "command_cpu_s": cpu}


def run_child(spec: dict) -> dict:
    """Run one benchmark ``spec`` in a fresh process (its peak RSS is its own)."""
    proc = subprocess.run([sys.executable, "-m", "tokenfair.benchmarks.child", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode == USER_ERROR_STATUS:          # the child's message names the place and the fix
        raise ValueError(proc.stderr.strip().removeprefix("error: "))
    if proc.returncode != 0:
        raise RuntimeError(f"simulation benchmark failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])

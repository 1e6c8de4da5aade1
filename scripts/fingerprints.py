"""Fingerprints of the simulator's results: one line per (workload, policy), to diff runs.

    python scripts/fingerprints.py [--quick] [--fleet] [--summary] > fp.txt

For every policy (fifo, sjf, priority, vtc, fair) on the built-in scenarios (hol, whale,
flood, burst) and, when ``../shared/traces`` is present, on ``azure:conv`` spread over 20
tenants (as ``tokenfair bench sim`` runs it), the run is simulated fast-forwarded and the line
holds sha256 of the request records, of the timeline, the end time and the scheduler's
counters (preemptions, recomputed tokens, swapped blocks, steps).  ``--summary`` adds sha256
of the whole ``simulate()`` summary with isolated baselines (less its wall-clock field): the
whole command's results, not only the loop's.  ``--fleet`` runs the same through the fleet
simulator with one replica (``sim.fleet``), which must print the same lines.
``--quick`` keeps the built-in scenarios only.  The core kind (mypyc / python) goes to stderr,
so compiled and interpreted outputs diff clean.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from tokenfair.core_build import core_kind
from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import request_record
from tokenfair.workloads.scenarios import build_scenario

POLICIES = ("fifo", "sjf", "priority", "vtc", "fair")
SCENARIOS = ("hol", "whale", "flood", "burst")
TRACE_TENANTS = 20


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _workloads(quick: bool):
    for name in SCENARIOS:
        yield (name, *build_scenario(name, 0))
    if quick:
        return
    if not (Path(__file__).resolve().parents[2] / "shared" / "traces").is_dir() and \
            not (Path.cwd().parent / "shared" / "traces").is_dir():
        print("note: no ../shared/traces; azure:conv left out", file=sys.stderr)
        return
    from tokenfair.contracts.contract import parse_contract
    from tokenfair.workloads.traces import load_workload
    yield "azure:conv", load_workload("azure:conv", seed=0, num_tenants=TRACE_TENANTS), parse_contract({})


def _run_once(wl, policy, contract, profile, fleet: bool):
    if fleet:
        from tokenfair.sim.fleet import FleetConfig, simulate_fleet_once
        return simulate_fleet_once(wl, policy, contract, profile, FleetConfig(num_replicas=1))
    from tokenfair.sim.simulate import simulate_once
    return simulate_once(wl, policy, contract, profile)


def _summary_hash(wl, policy, contract, profile) -> str:
    from tokenfair.sim.simulate import simulate
    out = simulate(wl, policy, contract, profile)
    summary = dict(out.summary)
    summary.pop("sim_wall_s", None)
    return _sha([out.records, out.timeline, summary])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="built-in scenarios only")
    ap.add_argument("--fleet", action="store_true", help="through the fleet simulator, one replica")
    ap.add_argument("--summary", action="store_true", help="also hash simulate()'s whole output")
    args = ap.parse_args()
    print(f"core={core_kind()}", file=sys.stderr)
    profile = load_profile(None)
    for name, wl, contract in _workloads(args.quick):
        for policy in POLICIES:
            res = _run_once(wl, policy, contract, profile, args.fleet)
            s = res.scheduler
            line = [name, policy, _sha([request_record(r) for r in res.requests]),
                    _sha(res.recorder.to_json()), repr(res.end_s), s.num_preemptions,
                    s.num_recomputed_tokens, s.num_swapped_blocks, s.num_steps]
            if args.summary:
                line.append(_summary_hash(wl, policy, contract, profile))
            print(" ".join(str(x) for x in line), flush=True)


if __name__ == "__main__":
    main()

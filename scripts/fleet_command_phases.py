"""CPU seconds and RSS of each phase of a fleet ``tokenfair simulate`` as ``bench fleet-sim``
runs it: the loop alone first (then let go), then reading, the loop, records + the fleet
timeline, isolated baselines, metrics, files.

    python scripts/fleet_command_phases.py [--replicas 64] [--tenants 1000] [--min-requests 250000] [--no-loop-alone]

``time.process_time`` around each phase (CPU time: on a shared machine wall time measures
the neighbours); RSS from /proc/self/status after each phase, and the peak so far.
"""

import argparse
import resource
import tempfile
import time

from tokenfair.benchmarks.bench import bench_workload
from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import summarize
from tokenfair.runtime.output import write_run
from tokenfair.sim.fleet import FleetConfig, simulate_fleet_once
from tokenfair.sim.fleet_metrics import fleet_records, fleet_summary, fleet_timeline
from tokenfair.sim.simulate import isolated_baselines
from tokenfair.workloads.traces import scale_rate


def _rss_mb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--min-requests", type=int, default=250_000)
    ap.add_argument("--policy", default="vtc")
    ap.add_argument("--no-loop-alone", action="store_true", help="skip the loop run alone first")
    args = ap.parse_args()
    spec = {"workload": "azure:conv", "seed": 0, "tenants": args.tenants, "min_requests": args.min_requests}
    config, profile = FleetConfig(num_replicas=args.replicas), load_profile(None)
    t = time.process_time()

    def lap(name: str) -> None:
        nonlocal t
        now = time.process_time()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"{name:<28} {now - t:7.2f} s CPU  RSS {_rss_mb():6d} MB  peak {peak:6d} MB", flush=True)
        t = now

    def load():
        contract, wl = bench_workload(spec)
        return contract, scale_rate(wl, float(args.replicas))

    if not args.no_loop_alone:
        contract, wl = load()
        first = simulate_fleet_once(wl, args.policy, contract, profile, config)
        del first, wl
        lap("(the loop alone, let go)")
    contract, wl = load()
    lap("reading")
    run = simulate_fleet_once(wl, args.policy, contract, profile, config)
    lap("loop")
    records = fleet_records(run)
    run.requests.clear()
    timeline = fleet_timeline(run)
    lap("records + fleet timeline")
    iso_req, iso_ten = isolated_baselines(wl, contract, profile)
    lap("isolated baselines")
    summary = summarize(records, timeline, contract, iso_req, iso_ten)
    summary["fleet"] = fleet_summary(run, config, summary["makespan_s"])
    lap("metrics")
    with tempfile.TemporaryDirectory() as d:
        write_run(d, records, summary, timeline)
    lap("files")
    print(f"{len(records):,} requests")


if __name__ == "__main__":
    main()

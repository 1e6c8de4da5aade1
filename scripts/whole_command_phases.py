"""CPU seconds of each phase of ``tokenfair simulate azure:conv --spread-tenants 20`` (fair):
imports, reading, the loop, records, isolated baselines, metrics, files.

    python scripts/whole_command_phases.py [--policy fair]

``time.process_time`` around each phase (CPU time: on a shared machine wall time measures the
neighbours).  The isolated baselines are split into the closed-form per-request baseline and
the per-tenant runs.
"""

import argparse
import tempfile
import time

t0 = time.process_time()
from tokenfair.cli.common import resolve_workload, shape_workload  # noqa: E402
from tokenfair.contracts.contract import Contract  # noqa: E402
from tokenfair.core.costmodel import load_profile  # noqa: E402
from tokenfair.evaluation.metrics import summarize  # noqa: E402
from tokenfair.evaluation.record_table import RecordTable  # noqa: E402
from tokenfair.runtime.output import write_run  # noqa: E402
from tokenfair.sim.isolated import isolated_e2e  # noqa: E402
from tokenfair.sim.simulate import isolated_baselines, reference_chunk, simulate_once  # noqa: E402
from tokenfair.workloads.gc_pause import gc_paused  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="fair")
    args = ap.parse_args()
    phases = {"imports": time.process_time() - t0}
    t = time.process_time()

    def lap(name: str) -> None:
        nonlocal t
        now = time.process_time()
        phases[name] = now - t
        t = now

    wl, _ = resolve_workload("azure:conv", 0)
    wl = shape_workload(wl, spread_tenants=20)
    lap("read")
    contract, profile = Contract(), load_profile(None)
    with gc_paused():                     # as simulate() runs them (sim/simulate.py)
        res = simulate_once(wl, args.policy, contract, profile)
        lap("loop")
        recs = RecordTable.from_requests(res.requests)
        timeline = res.recorder.to_json()
        lap("records")
        isolated_e2e(wl.rows, contract, profile, reference_chunk(contract))
        lap("isolated, closed form (timed alone)")
        iso_req, iso_ten = isolated_baselines(wl, contract, profile)
        lap("isolated baselines (both)")
        summary = summarize(recs, timeline, contract, iso_req, iso_ten)
        lap("metrics")
    with tempfile.TemporaryDirectory() as d:
        write_run(d, recs, summary, timeline)
    lap("files")
    total = sum(v for k, v in phases.items() if "timed alone" not in k)
    for k, v in phases.items():
        print(f"{k:<38} {v:6.2f} s CPU")
    print(f"{'total (the command)':<38} {total:6.2f} s CPU  {len(wl.rows) / total:,.0f} requests/s")


if __name__ == "__main__":
    main()

"""The fleet benchmark code runs (small sizes) and reports the loop and the whole command;
``bench sim`` reports both too.  No timing is asserted."""

import json
import subprocess
import sys

from tokenfair.benchmarks.bench import bench_sim
from tokenfair.benchmarks.fleet_sim import bench_fleet


def test_bench_fleet_small_reports_loop_and_whole_command():
    r = bench_fleet("hol", "vtc", replicas=3, router="least-loaded", min_requests=2000, rate_scale=3.0)
    assert r["requests"] == 2 * 1194 and r["replicas"] == 3 and r["tenants"] == 2
    assert r["wall_s"] > 0 and r["cpu_s"] > 0 and r["whole_wall_s"] > r["wall_s"] * 0.5
    assert r["engine_steps"] > 0 and r["peak_rss_mb"] > 0


def test_bench_sim_reports_the_whole_command():
    r = bench_sim("hol", "fifo", tenants=None)
    assert r["requests"] == 1194 and r["whole_wall_s"] > 0 and r["whole_requests_per_s"] > 0


def test_bench_fleet_cli_json_and_bad_router():
    res = subprocess.run([sys.executable, "-m", "tokenfair", "bench", "fleet-sim", "hol", "--replicas", "2",
                          "--max-requests", "300", "--no-whole", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["replicas"] == 2 and row["requests"] == 300 and "whole_wall_s" not in row
    bad = subprocess.run([sys.executable, "-m", "tokenfair", "bench", "fleet-sim", "hol", "--router", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "router" in bad.stderr

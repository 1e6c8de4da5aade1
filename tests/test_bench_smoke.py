"""The benchmark code runs (small sizes): it cannot rot.  No timing is asserted."""

import json
import subprocess
import sys

import pytest

from tokenfair.benchmarks.bench import bench_scheduler, bench_sim


def test_bench_scheduler_small():
    for policy in ("fifo", "vtc", "fair"):
        r = bench_scheduler(policy, running=16, waiting=200, tenants=20, iterations=10, repeats=1)
        assert r["policy"] == policy and r["running"] == 16 and r["median_ms_per_iteration"] > 0


@pytest.mark.usefixtures("public_traces")
def test_bench_sim_small():
    r = bench_sim("vtc", "fair", tenants=None, max_requests=200)
    assert r["requests"] == 200 and r["requests_per_s"] > 0 and r["peak_rss_mb"] > 0


def test_bench_sim_tiles_the_trace_to_min_requests():
    r = bench_sim("hol", "fifo", tenants=None, min_requests=2000)
    assert r["requests"] == 2 * 1194 and r["peak_rss_mb"] > 0 and r["wall_s"] > 0


def test_bench_cli_json():
    res = subprocess.run([sys.executable, "-m", "tokenfair", "bench", "scheduler", "--policies", "fair",
                          "--running", "8", "--waiting", "50,100", "--tenants", "5", "--iterations", "10",
                          "--repeats", "1", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert {r["waiting"] for r in rows} == {50, 100}
    assert set(rows[0]) == {"policy", "running", "waiting", "tenants", "median_ms_per_iteration",
                            "us_per_running_request", "core"}
    assert rows[0]["core"] in ("mypyc", "python")
    bad = subprocess.run([sys.executable, "-m", "tokenfair", "bench", "scheduler", "--policies", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2

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


def test_bench_cli_reads_policies_as_compare_does_and_refuses_bad_sizes():
    """``--policies`` is read as ``compare`` reads it (a spec with two options is one policy; an
    empty or repeated list is refused), and ``--waiting`` takes counts >= 0: an empty list ran
    nothing and exited 0, ``vtc:input_weight=1,output_weight=2`` was split into two policies,
    ``--waiting -5`` was benchmarked."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tokenfair", "bench", *args], capture_output=True, text=True)
    for args, message in ((("sim", "hol", "--policies", ""), "--policies is empty"),
                          (("sim", "hol", "--policies", "fifo,fifo"), "--policies names fifo more than once"),
                          (("scheduler", "--policies", "fair", "--waiting", "-5"), "--waiting takes comma-separated"),
                          (("scheduler", "--policies", "fair", "--waiting", "many"), "--waiting takes comma-separated")):
        res = cli(*args)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    res = cli("scheduler", "--policies", "vtc:input_weight=1,output_weight=3", "--running", "8", "--waiting", "50",
              "--tenants", "5", "--iterations", "10", "--repeats", "1", "--json")
    assert res.returncode == 0, res.stderr
    assert [json.loads(line)["policy"] for line in res.stdout.splitlines()] == ["vtc:input_weight=1,output_weight=3"]

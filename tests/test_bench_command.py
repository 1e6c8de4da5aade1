"""``bench sim`` also times ``tokenfair simulate`` as a user runs it (its own process).  No
timing is asserted."""

from tokenfair.benchmarks.bench import bench_sim


def test_bench_sim_times_the_command_as_run():
    r = bench_sim("hol", "fifo", tenants=3, max_requests=400)
    assert r["requests"] == 400
    assert r["command_wall_s"] > 0 and r["command_cpu_s"] > 0
    assert r["command_requests_per_s"] == r["requests"] / r["command_wall_s"]
    tiled = bench_sim("hol", "fifo", tenants=None, min_requests=2000)
    assert "command_wall_s" not in tiled          # no command-line option tiles a trace

"""The round-trip floor next to ``bench fleet-latency``'s figures: one dispatch script's
round trip from a client doing nothing else, back to back and after idling before each
call (a real redis-server).  No timing is asserted beyond the idling itself."""

from __future__ import annotations

import time

from tokenfair.fleet.bench_latency import busy_host_warning, format_latency, round_trip_floor, script_latency


def test_idle_round_trips_idle_before_each_call(redis_server):
    start = time.perf_counter()
    r = script_latency(redis_server.url, num_ops=110, gap_s=0.02)
    took = time.perf_counter() - start
    assert r["n"] == 10                           # the first 100 calls warm up
    assert took >= 110 * 0.02                     # each call waited its gap first
    assert 0 < r["p50_ms"] <= r["p99_ms"]


def test_floor_is_reported_beside_the_gateway_figures(redis_binary, tmp_path):
    floor = round_trip_floor(tmp_path, "tcp", num_idle_calls=105)
    assert floor["back_to_back"]["n"] == 1900 and floor["after_idle"]["n"] == 5
    path = {"hold": {"p50_ms": 1.0, "p99_ms": 2.0}, "ttft": {"p50_ms": 3.0, "p99_ms": 4.0},
            "e2e": {"p50_ms": 5.0, "p99_ms": 6.0}}
    lat = {"runs": 1, "rate": 20.0, "duration_s": 20.0, "load_average": 0.5,
           "tcp": {"paths": {"plain": path, "redis": path}, "redis_scripts_per_request": 2.8, "errors": 0,
                   "added_ms": {f"{m}_{p}": 0.0 for m in ("hold", "ttft", "e2e") for p in ("p50", "p99")},
                   "round_trip": floor}}
    text = format_latency(lat)
    assert "one dispatch script's round trip over tcp" in text
    assert "busy" not in text                     # no load average before the runs: no warning
    assert f"after 50 ms idle {floor['after_idle']['p50_ms']} / {floor['after_idle']['p99_ms']} (5 calls)" in text
    del floor["after_idle"]                       # num_idle_calls=0: the back-to-back figure alone
    assert "back to back" in format_latency(lat) and "idle" not in format_latency(lat)


def test_a_busy_host_is_named_beside_the_figures():
    assert busy_host_warning({"load_average_before": 0.9, "cpus": 2}) == ""
    warn = busy_host_warning({"load_average_before": 1.9, "cpus": 2})
    assert "load average 1.9 on 2 CPUs" in warn and "P99" in warn
    assert busy_host_warning({"load_average_before": 1.9, "cpus": 4}) == ""

"""The fleet simulator: one replica reproduces the single-engine run exactly; several replicas
end every request once, deterministically; the fair gateway in front runs the gateway's own
dispatch code, keeps each replica within its window and protects a light tenant."""

from __future__ import annotations

import pytest

import tokenfair.sched.gateway_round as gateway_round
import tokenfair.sim.fleet_gate as fleet_gate
from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import request_record
from tokenfair.workloads.scenarios import build_scenario
from tokenfair.sim.fleet import FleetConfig, simulate_fleet_once
from tokenfair.sim.fleet_metrics import fleet_records, fleet_timeline
from tokenfair.sim.fleet_simulate import simulate_fleet
from tokenfair.sim.simulate import simulate, simulate_once
from tokenfair.workloads.workload import TraceRow, Workload

POLICIES = ["fifo", "sjf", "priority", "vtc", "fair"]


def _fingerprint(res):
    s = res.scheduler
    return ([request_record(r) for r in res.requests], res.recorder.to_json(), res.end_s,
            (s.num_preemptions, s.num_recomputed_tokens, s.num_swapped_blocks, s.num_steps))


@pytest.mark.parametrize("scenario", ["hol", "whale"])
@pytest.mark.parametrize("policy", POLICIES)
def test_one_replica_reproduces_the_single_engine_run(scenario, policy):
    wl, contract = build_scenario(scenario, 0)
    prof = load_profile(None)
    single = simulate_once(wl, policy, contract, prof)
    fleet = simulate_fleet_once(wl, policy, contract, prof, FleetConfig(num_replicas=1))
    assert _fingerprint(fleet) == _fingerprint(single)


def test_one_replica_stepping_reproduces_stepping():
    wl, contract = build_scenario("burst", 0)
    prof = load_profile(None)
    single = simulate_once(wl, "fair", contract, prof, fast=False)
    fleet = simulate_fleet_once(wl, "fair", contract, prof, FleetConfig(num_replicas=1), fast=False)
    assert _fingerprint(fleet) == _fingerprint(single)


def test_one_replica_summary_matches_simulate_but_for_the_fleet_section():
    wl, contract = build_scenario("hol", 0)
    prof = load_profile(None)
    a = simulate(wl, "vtc", contract, prof)
    b = simulate_fleet(wl, "vtc", contract, prof, FleetConfig(num_replicas=1))
    fleet = b.summary.pop("fleet")
    for s in (a.summary, b.summary):
        s.pop("sim_wall_s")
    assert a.summary == b.summary
    assert [dict(r, replica=0) for r in a.records] == b.records
    assert fleet["replicas"] == 1 and fleet["per_replica"][0]["requests"] == len(wl.rows)


def _check_terminal(run, n):
    assert len(run.requests) == n
    assert all(r.status.is_terminal and r.reason for r in run.requests)
    assert sorted(r.seq for r in run.requests) == list(range(n))


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "kv-aware", "prefix-aware"])
def test_several_replicas_end_every_request_once_and_deterministically(router):
    wl, contract = build_scenario("whale", 0)
    prof = load_profile(None)
    cfg = FleetConfig(num_replicas=3, router=router)
    a = simulate_fleet_once(wl, "vtc", contract, prof, cfg)
    b = simulate_fleet_once(wl, "vtc", contract, prof, cfg)
    _check_terminal(a, len(wl.rows))
    assert fleet_records(a) == fleet_records(b)
    assert fleet_timeline(a) == fleet_timeline(b)
    assert {k for k in a.replica_of if k is not None} == {0, 1, 2}
    assert sum(r.num_routed for r in a.replicas) == sum(k is not None for k in a.replica_of)
    for r in a.replicas:
        r.sched.check_invariants()


def test_more_replicas_cut_queueing():
    wl, contract = build_scenario("whale", 0)
    prof = load_profile(None)
    one = simulate_fleet(wl, "fifo", contract, prof, FleetConfig(num_replicas=1), isolated=False).summary
    four = simulate_fleet(wl, "fifo", contract, prof, FleetConfig(num_replicas=4, router="least-loaded"),
                          isolated=False).summary
    assert four["overall"]["ttft_s"]["p99"] < one["overall"]["ttft_s"]["p99"] / 4
    assert four["fleet"]["routing_imbalance"] < 1.2
    timeline = four["engine_steps"]
    assert timeline > 0


def _heavy_and_light(n_heavy: int = 600, n_light: int = 40) -> Workload:
    rows = [TraceRow(f"h{i}", i * 0.01, "heavy", 1500, 300) for i in range(n_heavy)]
    rows += [TraceRow(f"l{i}", 1.0 + i * 0.5, "light", 200, 50) for i in range(n_light)]
    rows.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload("heavy-light", tuple(rows))


def test_the_gateway_runs_the_gateways_dispatch_code_and_keeps_windows(monkeypatch):
    calls = []
    real = gateway_round.release_round

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fleet_gate, "release_round", counting)
    contract = parse_contract({"admission": {"shed_over_max_wait": False}})
    prof = load_profile(None)
    cfg = FleetConfig(num_replicas=2, router="least-loaded", fleet_policy="fair", gateway_window=4)
    gate_max = []
    orig_dispatch = fleet_gate.FleetGate.dispatch

    def watch(self, *a, **k):
        orig_dispatch(self, *a, **k)
        gate_max.append(max(len(p) for p in self.pending))

    monkeypatch.setattr(fleet_gate.FleetGate, "dispatch", watch)
    wl = _heavy_and_light()
    run = simulate_fleet_once(wl, "fifo", contract, prof, cfg)
    _check_terminal(run, len(wl.rows))
    assert calls, "the fleet gateway did not go through sched.gateway_round"
    assert max(gate_max) == 4                 # windows fill up, never beyond
    assert run.gate.num_running == 0 and all(not p for p in run.gate.pending)
    assert all(r.status.value == "finished" for r in run.requests)


def test_the_fair_gateway_protects_a_light_tenant_better_than_round_robin():
    contract = parse_contract({"admission": {"shed_over_max_wait": False}})
    prof = load_profile(None)
    wl = _heavy_and_light()
    rr = simulate_fleet(wl, "fifo", contract, prof, FleetConfig(num_replicas=2), isolated=False).summary
    gw = simulate_fleet(wl, "fifo", contract, prof,
                        FleetConfig(num_replicas=2, router="least-loaded", fleet_policy="fair", gateway_window=8),
                        isolated=False).summary
    assert rr["status"] == gw["status"] == {"finished": len(wl.rows)}
    light_rr, light_gw = rr["tenants"]["light"]["ttft_s"]["p99"], gw["tenants"]["light"]["ttft_s"]["p99"]
    assert light_gw < light_rr / 2, (light_gw, light_rr)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_rows = st.lists(st.tuples(st.floats(0, 20), st.sampled_from(["a", "b", "c"]), st.integers(1, 3000),
                           st.integers(1, 300), st.lists(st.integers(0, 5), max_size=4)),
                 min_size=1, max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_rows, n=st.integers(1, 4),
       router=st.sampled_from(["round-robin", "least-loaded", "kv-aware", "prefix-aware", "locality"]),
       gated=st.booleans(), policy=st.sampled_from(["fifo", "vtc", "fair"]))
def test_any_fleet_ends_every_request_once_with_a_reason(rows, n, router, gated, policy):
    trace = sorted(rows, key=lambda r: r[0])
    wl = Workload("h", tuple(TraceRow(f"r{i}", t, ten, p, o, prefix_hashes=tuple(h))
                             for i, (t, ten, p, o, h) in enumerate(trace)))
    cfg = FleetConfig(num_replicas=n, router=router, fleet_policy="fair" if gated else "none",
                      prefix_cache=True, gateway_window=3)
    run = simulate_fleet_once(wl, policy, parse_contract({}), load_profile(None), cfg)
    _check_terminal(run, len(trace))
    for r in run.replicas:
        r.sched.check_invariants()
        assert not r.sched.running and not r.sched.has_work()
    for req, k in zip(run.requests, run.replica_of):
        if k is None:                         # ended at intake or at the gateway: never ran
            assert req.scheduled_s is None and req.status.value in ("rejected", "expired", "failed")
        if req.status.value == "finished":
            assert req.first_token_s is not None and req.finish_s >= req.first_token_s >= req.arrival_s
    if n == 1 and not gated:
        single = simulate_once(wl, policy, parse_contract({}), load_profile(None))
        plain = simulate_fleet_once(wl, policy, parse_contract({}), load_profile(None), FleetConfig(num_replicas=1))
        assert _fingerprint(plain) == _fingerprint(single)

"""Fast-forwarding runs of identical decode steps gives exactly the per-request results of
stepping one iteration at a time."""

import pytest

from tokenfair.contract import parse_contract
from tokenfair.costmodel import load_profile
from tokenfair.metrics import request_record
from tokenfair.scenarios import build_scenario
from tokenfair.sim.simulate import simulate_once
from tokenfair.traces import limit, load_workload, spread_tenants
from tokenfair.workload import Workload


def test_fair_opts_out_until_its_statistics_are_path_independent():
    from tokenfair.sched.registry import make_policy
    assert make_policy("fair").supports_fast_forward is False
    assert make_policy("fifo").supports_fast_forward is True


def _records(wl, policy, contract, profile, fast):
    res = simulate_once(wl, policy, contract, profile, fast=fast)
    return [request_record(r) for r in res.requests], res


@pytest.mark.parametrize("policy", ["fifo", "vtc", "fair"])
@pytest.mark.parametrize("scenario", ["burst", "hol"])
def test_fast_forward_equals_stepping_on_scenarios(policy, scenario):
    wl, c = build_scenario(scenario)
    wl = Workload(wl.name, wl.rows[:400])
    prof = load_profile(None)
    fast, rf = _records(wl, policy, c, prof, True)
    slow, rs = _records(wl, policy, c, prof, False)
    assert fast == slow
    assert rf.recorder.num_steps == rs.recorder.num_steps
    assert rf.end_s == rs.end_s


@pytest.mark.parametrize("policy", ["fifo", "fair"])
def test_fast_forward_equals_stepping_on_a_public_trace(policy):
    wl = spread_tenants(limit(load_workload("azure:conv"), 1500), 20, seed=0)
    prof = load_profile(None)
    fast, rf = _records(wl, policy, parse_contract({}), prof, True)
    slow, rs = _records(wl, policy, parse_contract({}), prof, False)
    assert fast == slow
    tf, ts = rf.recorder.to_json(), rs.recorder.to_json()
    assert tf["tokens"] == ts["tokens"] and tf["tenant_service"] == ts["tenant_service"]


@pytest.mark.parametrize("policy", ["fifo", "vtc"])
def test_fast_forward_exact_on_a_larger_trace(policy):
    wl = spread_tenants(limit(load_workload("azure:conv"), 5000), 20, seed=0)
    prof = load_profile(None)
    fast, rf = _records(wl, policy, parse_contract({}), prof, True)
    slow, rs = _records(wl, policy, parse_contract({}), prof, False)
    assert fast == slow
    assert rf.recorder.num_steps == rs.recorder.num_steps

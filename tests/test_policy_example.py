"""docs/POLICIES.md's example policy (examples/policies/least_served.py): it registers, runs
on a built-in scenario with every request ending once, fast-forwards exactly, and does what
it says -- the chat tenant of ``hol`` no longer waits behind the document prompts."""

from pathlib import Path

from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import request_record
from tokenfair.workloads.scenarios import build_scenario
from tokenfair.sched.registry import make_policy, policy_names
from tokenfair.sim.simulate import simulate, simulate_once

from module_file import load_module_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "policies" / "least_served.py"


def _load_example():
    return load_module_file(EXAMPLE, "least_served_example")


def test_the_docs_show_the_example_file_as_it_is():
    doc = (ROOT / "docs" / "POLICIES.md").read_text()
    assert EXAMPLE.read_text().strip() in doc


def test_the_example_policy_registers_runs_and_helps_the_light_tenant():
    _load_example()
    assert "least-served" in policy_names() and make_policy("least-served").can_fast_forward()
    wl, contract = build_scenario("hol", 0)
    rr = simulate(wl, "least-served", contract, load_profile(None), isolated=False)
    fifo = simulate(wl, "fifo", contract, load_profile(None), isolated=False)
    assert len(rr.records) == len(wl.rows)
    assert all(r["status"] in ("finished", "rejected", "expired", "failed") and r["reason"] for r in rr.records)
    p99 = lambda out: out.summary["tenants"]["chat"]["ttft_s"]["p99"]      # noqa: E731
    assert p99(rr) < 0.25 * p99(fifo), (p99(rr), p99(fifo))


def test_the_example_policy_fast_forwards_exactly():
    _load_example()
    wl, contract = build_scenario("hol", 0)
    fast = simulate_once(wl, "least-served", contract, load_profile(None), fast=True)
    slow = simulate_once(wl, "least-served", contract, load_profile(None), fast=False)
    assert fast.scheduler.num_fast_forwarded_steps > 0
    assert [request_record(r) for r in fast.requests] == [request_record(r) for r in slow.requests]
    assert fast.recorder.to_json() == slow.recorder.to_json()

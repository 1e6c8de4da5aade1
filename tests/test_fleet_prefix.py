"""Prefix caching in the simulated fleet: the LRU cache, the engine charging only uncached
prefill, the routers' choices, the synthetic shared-prefix chat workload, and the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.workloads.prefix import ChatSpec, generate_chat, parse_chat_spec
from tokenfair.core.request import Request
from tokenfair.sched.interface import SchedulerOutput
from tokenfair.sim.engine import SimEngine
from tokenfair.sim.fleet import FleetConfig
from tokenfair.sim.fleet_simulate import simulate_fleet
from tokenfair.sim.prefix_cache import PrefixCache
from tokenfair.sim.routers import make_router
from tokenfair.workloads.traces import load_workload
from tokenfair.workloads.workload import WorkloadError, read_trace, write_trace


def test_cache_counts_the_leading_run_and_evicts_least_recently_used():
    c = PrefixCache(capacity_blocks=4, block_tokens=10)
    assert c.lookup_and_insert((1, 2, 3), 30) == 0
    assert c.peek((1, 2, 9)) == 2 and c.peek((9, 1)) == 0
    assert c.lookup_and_insert((1, 2, 7), 25) == 20          # blocks 1, 2 cached
    assert c.lookup_and_insert((1, 2, 3), 30) == 29          # all cached: one token left to compute
    assert len(c) == 4                                       # 1, 2, 3, 7; 7 is the oldest now
    c.lookup_and_insert((5,), 10)
    assert c.peek((1, 2, 3)) == 3 and c.peek((7,)) == 0 and c.num_evicted == 1
    assert c.hit_rate == (2 + 3) / (3 + 3 + 3 + 1)


def test_engine_charges_only_the_uncached_prefill():
    prof = load_profile(None)
    eng = SimEngine(prof)
    req = Request("r", 0, "t", "interactive", 0.0, 2048, 100)
    eng.add(req, 50)
    full = eng.execute(SchedulerOutput(prefill=[(req, 1024)])).duration_s
    eng.cached_tokens[req] = 1000
    charged = eng.uncached_prefill([(req, 1024)])
    assert charged == [(24, 1000)]
    part = eng.execute(SchedulerOutput(prefill=[(req, 1024)])).duration_s
    assert part < full
    assert part == prof.cost.step_s([(24, 1000)], 0, 0)
    req.num_computed = 1024                                   # past the cached prefix: full charge
    assert eng.uncached_prefill([(req, 512)]) == [(512, 1024)]
    eng.forget(req)
    assert req not in eng.cached_tokens


class _View:
    def __init__(self, index, load, kv=0.0, cached=0):
        self.index, self._load, self._kv, self._cached = index, load, kv, cached

    def load(self):
        return self._load

    def kv_usage(self):
        return self._kv

    def cached_prefix(self, hashes):
        return self._cached


def test_routers_choose_what_they_say():
    views = [_View(0, 5, 0.9, 3), _View(1, 2, 0.5, 0), _View(2, 2, 0.1, 1), _View(3, 40, 0.0, 9)]
    rr = make_router("round-robin")
    assert [rr.choose(views, ()) for _ in range(5)] == [0, 1, 2, 3, 0]
    assert make_router("least-loaded").choose(views, ()) == 1          # ties: lowest index
    assert make_router("kv-aware").choose(views, ()) == 3
    # replica 3 holds the longest prefix but is far over the bound (1.5 x (2 + 1) = 4.5)
    assert make_router("prefix-aware", load_bound=1.5).choose(views, (1, 2, 3)) == 2
    assert make_router("prefix-aware", load_bound=3.0).choose(views, (1, 2, 3)) == 0
    assert make_router("locality").choose(views, (1, 2, 3)) == 3
    assert make_router("prefix-aware").choose(views, ()) == 1          # no hashes: least loaded
    with pytest.raises(ValueError, match="unknown router"):
        make_router("random")


def test_chat_workload_shares_system_prompts_and_conversation_prefixes():
    wl = generate_chat(ChatSpec(num_tenants=3, conversations_per_s=1.0, duration_s=120, block_tokens=512), seed=3)
    assert wl == generate_chat(ChatSpec(num_tenants=3, conversations_per_s=1.0, duration_s=120), seed=3)
    assert [r.arrival_s for r in wl.rows] == sorted(r.arrival_s for r in wl.rows)
    by_tenant = {}
    for r in wl.rows:
        assert len(r.prefix_hashes) == -(-r.prompt_tokens // 512)
        by_tenant.setdefault(r.tenant, set()).add(r.prefix_hashes[:4])   # 2048-token system prompt
    assert all(len(v) == 1 for v in by_tenant.values()) and len(by_tenant) == 3
    assert len({v.pop() for v in by_tenant.values()}) == 3               # each tenant its own prompt
    later = [r for r in wl.rows if r.prompt_tokens > 3000]
    assert later, "no multi-turn conversation grew past the system prompt"
    firsts = {r.prefix_hashes[4] for r in later}
    assert len(firsts) < len(later)                                      # turns of one chat share blocks


def test_chat_spec_errors_name_the_option():
    assert parse_chat_spec("num_tenants=4,think_s=5").num_tenants == 4
    with pytest.raises(WorkloadError, match="key one of"):
        parse_chat_spec("tenants=4")
    with pytest.raises(WorkloadError, match="expected a number"):
        parse_chat_spec("num_tenants=x")
    with pytest.raises(WorkloadError, match="out-of-range"):
        parse_chat_spec("mean_turns=0.5")


def test_prefix_hashes_round_trip_through_a_trace_file(tmp_path):
    wl = load_workload("chat:duration_s=30", seed=1)
    write_trace(wl.rows, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl").rows == wl.rows


def test_prefix_aware_routing_with_the_cache_beats_round_robin_on_hits():
    wl = load_workload("chat:num_tenants=6,duration_s=240,conversations_per_s=1.5", seed=0)
    contract, prof = parse_contract({}), load_profile(None)
    out = {}
    for router in ("round-robin", "prefix-aware"):
        cfg = FleetConfig(num_replicas=4, router=router, prefix_cache=True, cache_tokens=20_000)
        out[router] = simulate_fleet(wl, "vtc", contract, prof, cfg, isolated=False).summary
    rr, pa = out["round-robin"]["fleet"], out["prefix-aware"]["fleet"]
    assert pa["cache_hit_rate"] > rr["cache_hit_rate"] + 0.1      # small caches: placement matters
    assert pa["routing_imbalance"] < 2.0
    assert out["prefix-aware"]["engine_busy_s"] < out["round-robin"]["engine_busy_s"]
    assert all(p["prefix_cache"]["lookups"] == p["requests"] for p in pa["per_replica"])


def test_cli_simulate_replicas_writes_replica_fields_and_fleet_summary(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "chat:duration_s=60", "--replicas", "3", "--router", "prefix-aware",
                              "--prefix-cache", "--fleet-policy", "fair", "--policy", "fifo", "--no-isolated",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {r["replica"] for r in recs} <= {0, 1, 2, None} and {0, 1, 2} <= {r["replica"] for r in recs}
    fleet = json.loads((tmp_path / "summary.json").read_text())["fleet"]
    assert fleet["replicas"] == 3 and fleet["gateway"]["policy"] == "fair"
    assert len(fleet["per_replica"]) == 3 and fleet["cache_hit_rate"] > 0
    bad = runner.invoke(app, ["simulate", "hol", "--replicas", "2", "--router", "nope", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "--router" in bad.output

import json
import subprocess
import sys

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import BUILTIN_PROFILES, Profile, load_profile
from tokenfair.workloads.scenarios import SCENARIOS, build_scenario
from tokenfair.sim.isolated import isolated_latency
from tokenfair.sim.simulate import simulate, simulate_once
from tokenfair.workloads.traces import load_workload, slice_time
from tokenfair.workloads.workload import TraceRow, Workload


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tokenfair", *args], capture_output=True, text=True)


def test_cli_simulate_writes_every_request_once(tmp_path):
    res = _run_cli("simulate", "burst", "--policy", "fair", "--out", str(tmp_path), "--no-isolated")
    assert res.returncode == 0, res.stderr
    wl, _ = build_scenario("burst")
    recs = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["request_id"] for r in recs) == sorted(r.request_id for r in wl.rows)
    for r in recs:
        assert r["status"] in {"finished", "rejected", "expired", "failed"} and r["reason"]
        for k in ("tenant", "class", "arrival_s", "scheduled_s", "first_token_s", "finish_s",
                  "prompt_tokens", "output_tokens", "preemptions", "deadline_s"):
            assert k in r
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["contract_version"] == "burst-v1" and summary["policy"] == "fair"
    assert len(summary["contract_hash"]) == 16 and summary["profile"] == "llama3-8b-a100"


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_request_ends_exactly_once(name):
    wl, c = build_scenario(name)
    res = simulate_once(wl, "fifo", c, load_profile(None))
    assert sorted(r.request_id for r in res.requests) == sorted(r.request_id for r in wl.rows)
    assert all(r.status.is_terminal for r in res.requests)


@pytest.mark.usefixtures("public_traces")
def test_public_trace_replay_every_request_once():
    wl = slice_time(load_workload("vtc"), 0, 120)
    res = simulate_once(wl, "fair", parse_contract({}), load_profile("vtc-a10g-llama2-7b"))
    assert len(res.requests) == len(wl.rows) > 100
    assert len({r.request_id for r in res.requests}) == len(wl.rows)
    assert all(r.status.is_terminal and r.reason for r in res.requests)


def test_scenarios_are_seeded_and_reproducible():
    a, _ = build_scenario("whale", seed=1)
    b, _ = build_scenario("whale", seed=1)
    c, _ = build_scenario("whale", seed=2)
    assert a.rows == b.rows and a.rows != c.rows


def test_simulation_is_deterministic():
    wl, c = build_scenario("hol")
    wl = Workload("hol", wl.rows[:300])
    s1 = simulate(wl, "fair", c, load_profile(None), isolated=False).records
    s2 = simulate(wl, "fair", c, load_profile(None), isolated=False).records
    assert s1 == s2


def test_cost_model_matches_roofline_anchors():
    # anchors.md: Llama-2-7B on A100, non-attention ops: 9.3 ms at 1 token, 33.4 at 512, 133 at 2048
    p = BUILTIN_PROFILES["llama2-7b-a100"]
    for n, ms in ((1, 9.3), (512, 33.4), (2048, 133.0)):
        got = (p.step_s([(n, 0)], 0, 0) - p.overhead_s) * 1000
        assert abs(got - ms) / ms < 0.12, (n, got)
    # linear form reproduces the VTC artifact's fit
    v = BUILTIN_PROFILES["vtc-a10g-llama2-7b"]
    assert v.step_s([], 1000, 10) == pytest.approx(0.0163 + 10 * 0.000245 + 1000 * 2e-6)


def test_profile_file_and_errors(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("kind: linear\nprefill_token_s: 0.001\ndecode_base_s: 0.02\nkv_capacity_tokens: 5000\n")
    p = load_profile(str(f))
    assert p.name == "p" and p.num_blocks == 5000 // 16
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: linear\nmfu: 3\n")
    with pytest.raises(ValueError, match="mfu"):
        load_profile(str(bad))
    with pytest.raises(ValueError, match="not a built-in profile"):
        load_profile("no-such-profile")
    # an infinite cost made a step's time NaN and crashed the run with a traceback
    bad.write_text("kind: linear\nprefill_token_s: .inf\n")
    with pytest.raises(ValueError, match="bad.yaml: prefill_token_s: Input should be a finite number"):
        load_profile(str(bad))


def test_isolated_latency_equals_simulating_alone():
    p = load_profile(None)
    c = parse_contract({})
    row = TraceRow("x", 0.0, "t", 3000, 50)
    ttft, e2e = isolated_latency(row, c, p, c.engine.chunk_size)
    res = simulate_once(Workload("one", (row,)), "fifo", parse_contract(
        {"engine": {"prefill_token_budget": 512, "decode_token_budget": 1, "chunk_size": 512}}), p)
    r = res.requests[0]
    assert r.first_token_s == pytest.approx(ttft, rel=0.02)
    assert r.finish_s == pytest.approx(e2e, rel=0.02)


def test_prompt_beyond_kv_capacity_is_rejected_not_hung():
    p = Profile(name="small", kv_capacity_tokens=1000)
    rows = (TraceRow("big", 0.0, "t", 5000, 5), TraceRow("ok", 0.1, "t", 10, 5))
    res = simulate_once(Workload("w", rows), "fifo", parse_contract({}), p)
    st = {r.request_id: (r.status.value, r.reason) for r in res.requests}
    assert st["big"][0] == "rejected" and "kv_capacity" in st["big"][1]
    assert st["ok"][0] == "finished"


def test_cli_bad_inputs_exit_2(tmp_path):
    assert _run_cli("simulate", "nope", "--out", str(tmp_path)).returncode == 2
    assert _run_cli("simulate", "hol", "--policy", "zzz", "--out", str(tmp_path)).returncode == 2
    assert _run_cli("simulate", "hol", "--profile", "zzz", "--out", str(tmp_path)).returncode == 2
    bad = tmp_path / "c.yaml"
    bad.write_text("engine: {chunk_size: 4096, prefill_token_budget: 1024}\n")
    res = _run_cli("simulate", "hol", "--contract", str(bad), "--out", str(tmp_path))
    assert res.returncode == 2 and "chunk_size must be <= prefill_token_budget" in res.stderr


def test_cli_runs_a_trace_with_a_huge_prompt_and_a_huge_output(tmp_path):
    """Both end in a terminal state (rejected; stopped at the default max_tokens) and the
    isolated baselines skip what the run could not do instead of computing it token by token."""
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens\n"
                     "p,0,a,1000000000000,10\no,0,b,10,1000000000000\nn,1,b,10,10\n")
    res = subprocess.run([sys.executable, "-m", "tokenfair", "simulate", str(trace), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    recs = {r["request_id"]: r for r in map(json.loads, (tmp_path / "o" / "requests.jsonl").read_text().splitlines())}
    assert recs["p"]["status"] == "rejected" and recs["p"]["reason"].startswith("prompt_exceeds_kv_capacity")
    assert recs["o"]["status"] == "finished" and recs["o"]["output_tokens"] == 32_768


def test_cli_refuses_sizes_past_memory_with_exit_2(tmp_path):
    """Sizes that would exhaust memory or overflow the timeline end at once, exit 2, no traceback."""
    cases = {("--replicas", "10001"): "--replicas: Input should be less than or equal to 10000",
             ("--spread-tenants", "1000001"): "less than or equal to",
             ("--rate-scale", "1e-300"): "past the 1e+07 s a workload may span"}
    for args, message in cases.items():
        res = _run_cli("simulate", "hol", "--no-isolated", *args, "--out", str(tmp_path))
        assert res.returncode == 2 and message in " ".join(res.stderr.split()), (args, res.stderr)
        assert "Traceback" not in res.stderr
    res = _run_cli("bench", "sim", "hol", "--policies", "fifo", "--min-requests", "100000000")
    assert res.returncode == 2 and res.stderr.startswith("error: tile to 100000000 requests"), res.stderr
    assert "Traceback" not in res.stderr


def test_cli_refuses_fleet_options_without_replicas(tmp_path):
    """A fleet option on a one-engine run was ignored without a word (``--prefix-cache`` gave no
    cache, ``--cached-discount 2`` passed): it is refused, naming the options and the fix."""
    for args in (["--prefix-cache"], ["--cached-discount", "2"], ["--router", "prefix-aware", "--load-bound", "0"],
                 ["--fleet-policy", "fair", "--locality-hold", "-1"]):
        res = _run_cli("simulate", "hol", "--no-isolated", *args, "--out", str(tmp_path))
        err = " ".join(res.stderr.split())
        assert res.returncode == 2 and "fleet option(s) without --replicas; add --replicas N" in err, (args, err)
        assert all(a in err for a in args if a.startswith("--")) and "Traceback" not in err
    res = _run_cli("simulate", "hol", "--no-isolated", "--replicas", "1", "--prefix-cache", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr


@pytest.mark.usefixtures("public_traces")
def test_cli_slices_scales_and_spreads_a_public_trace(tmp_path):
    res = _run_cli("simulate", "azure:conv", "--start-s", "600", "--end-s", "660", "--rate-scale", "2",
                   "--spread-tenants", "4", "--no-isolated", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert 100 < len(recs) < 1000 and len({r["tenant"] for r in recs}) == 4
    assert max(r["arrival_s"] for r in recs) <= 30.0 + 1e-6        # 60 s slice at twice the rate
    assert _run_cli("simulate", "vtc", "--start-s", "9999", "--out", str(tmp_path)).returncode == 2


def test_cli_skip_bad_rows_counts_them(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens\n"
                     "a,0,t,10,5\nb,0.1,t,x,5\nc,0.2,t,10,5\n")
    bad = _run_cli("simulate", str(trace), "--out", str(tmp_path / "o1"), "--no-isolated")
    assert bad.returncode == 2 and "t.csv:3" in bad.stderr and "prompt_tokens" in bad.stderr
    ok = _run_cli("simulate", str(trace), "--skip-bad-rows", "--out", str(tmp_path / "o2"), "--no-isolated")
    assert ok.returncode == 0, ok.stderr
    assert "skipped 1 bad row" in ok.stderr
    assert len((tmp_path / "o2" / "requests.jsonl").read_text().splitlines()) == 2

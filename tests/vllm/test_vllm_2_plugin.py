"""vLLM with the tokenfair scheduler vs stock vLLM (FCFS), the same burst on both, runs
alternated: a light tenant arriving 2 s into two heavy tenants' burst, the heavy tenants
weighted 2:1 (tests/vllm/contract.yaml); greedy outputs with and without the plugin.
Each server runs the burst alone, in turn (stock, plugin; plugin, stock; stock, plugin),
its engine on the same CPU as the other's; throughput is compared as the median."""

from __future__ import annotations

import statistics

import httpx
import pytest

from tokenfair.integrations.burst import TenantLoad, run_burst, run_in_turn, summarize
from tokenfair.integrations.vllm_metrics import read_counters

# The light tenant arrives 2 s in, with most of the burst still queued (about 36 of 48 on
# this CPU): stock serves it after all of them (5-6 s); the fair order starts it at the next
# free slot.  No slot is taken from a running request (no preemption), so its wait is up to
# one wave of the running requests (about 1 s here), which is why the light tenant must
# arrive with several waves queued ahead for the 0.5x bound to measure the order and not the
# phase it arrives in (arriving 4 s into a burst of 18 each, stock's wait was 2-2.8 s and one
# unlucky phase took the plugin's median to 0.62x).  24 requests each keep both heavy tenants
# backlogged together for about 5 s (at 18 each, 1.9-4 s: under the 2 s the shares need).
NUM_HEAVY = 24              # requests per heavy tenant
NUM_LIGHT = 3
BURST = [TenantLoad("heavy_a", NUM_HEAVY, 5, 32), TenantLoad("heavy_b", NUM_HEAVY, 5, 32),
         TenantLoad("light", NUM_LIGHT, 1, 8, start_s=2.0, spacing_s=1.0, klass="interactive")]
BURST_OUTPUT_TOKENS = 2 * NUM_HEAVY * 32 + NUM_LIGHT * 8
RUNS = 3
# a run starts at least this long after the same server's previous run: two fair-policy
# time constants (its share meter's share_tau_s, 10 s), so what a tenant received at the
# end of the last burst, alone while the other had finished, has decayed to 14% and does
# not make the other "light" (preferred, up to the WFQ credit) at the start of the next
REST_S = 20.0
HEAVY = ("heavy_a", "heavy_b")
MAX_NUM_SEQS = 6            # as conftest starts both servers


@pytest.fixture(scope="module")
def engine_work(vllm_servers, vh):
    """{"runs": per server, each round's summary; "counters": per server, vLLM's engine
    counters over its rounds (each server gets no other traffic meanwhile); "records": the
    plugin's records of the requests of these rounds}."""
    urls = {name: vllm_servers[name].url for name in ("stock", "plugin")}
    before = {name: read_counters(url) for name, url in urls.items()}
    num_records = len(vh.read_records(vllm_servers["records"]))
    runs = {name: [summarize(results, HEAVY, slots=MAX_NUM_SEQS) for results in bursts]
            for name, bursts in run_in_turn(urls, BURST, RUNS, rest_s=REST_S).items()}
    return {"runs": runs, "counters": {name: read_counters(url).delta(before[name]) for name, url in urls.items()},
            "records": vh.read_records(vllm_servers["records"])[num_records:]}


@pytest.fixture(scope="module")
def burst_runs(engine_work):
    return engine_work["runs"]


def _median(runs: list[dict], f) -> float:
    return statistics.median(f(r) for r in runs)


def test_plugin_runs_the_compiled_core(vllm_servers):
    """The plugin's log line says which core vLLM's engine process imported; the figures below
    assume the compiled one (interpreted, the scheduler's work per step halves throughput)."""
    log_path = getattr(vllm_servers["plugin"], "log_path", None)
    if log_path is None:
        pytest.skip("servers reused from TOKENFAIR_VLLM_REUSE: no log to read")
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if "tokenfair scheduler:" in ln]
    assert lines, vllm_servers["plugin"].tail()
    assert "core=mypyc" in lines[-1], lines[-1]


def test_every_request_finishes(burst_runs):
    for name, runs in burst_runs.items():
        for r in runs:
            assert r["failed"] == 0, (name, r["failures"])
            assert r["output_tokens"] == BURST_OUTPUT_TOKENS


def test_light_tenant_ttft_under_a_heavy_burst(burst_runs):
    light = lambda r: r["tenants"]["light"]["ttft_p99_s"]  # noqa: E731
    plugin, stock = _median(burst_runs["plugin"], light), _median(burst_runs["stock"], light)
    assert plugin <= 0.5 * stock, (plugin, stock)


def test_light_requests_start_before_the_queued_burst(engine_work):
    """The order behind the TTFT above, from the plugin's own records (engine clock, no
    timing margin): while a light request waited, no heavy request queued before it was
    admitted; it took the first free slot."""
    recs = engine_work["records"]
    lights = [r for r in recs if r["tenant"] == "light"]
    assert len(lights) == RUNS * NUM_LIGHT, len(lights)
    for light in lights:
        arrived, started = light["arrival_s"], light["scheduled_s"]
        overtook = [r["request_id"] for r in recs if r["tenant"] in HEAVY
                    and r["arrival_s"] < arrived < r["scheduled_s"] < started]
        assert not overtook, (light, overtook)


def test_weighted_shares_while_backlogged(burst_runs):
    share = _median(burst_runs["plugin"], lambda r: r["shares"]["heavy_a"])
    assert abs(share - 2 / 3) <= 0.05 * 2 / 3, [r["shares"] for r in burst_runs["plugin"]]
    for r in burst_runs["plugin"]:
        lo, hi = r["backlogged_window_s"]
        assert hi - lo > 2.0                           # a window long enough to mean something


# A step of vLLM's engine costs a fixed part plus a part per prefill token (docs/BENCHMARKS.md,
# from the plugin's step log), so the same requests in about as many steps, with the same
# prefill tokens, are stock's throughput.  The fair order admits the identical heavy requests
# one or two at a time rather than in waves of 6, so the drain at the end of a burst runs
# fewer than 6 at a time: a few percent more steps.  Tokens per second are compared by
# `tokenfair bench vllm --part plugin` (timing belongs in benchmarks, not tests).
MAX_STEP_RATIO = 1.10


def test_plugin_uses_the_engine_as_stock_does(engine_work):
    counters = engine_work["counters"]
    plugin, stock = counters["plugin"], counters["stock"]
    assert plugin.num_generation_tokens == stock.num_generation_tokens == RUNS * BURST_OUTPUT_TOKENS
    assert plugin.num_prompt_tokens == stock.num_prompt_tokens > 0
    assert plugin.num_step_tokens <= stock.num_step_tokens     # prefill computed: no more than stock's
    assert plugin.num_preemptions == stock.num_preemptions == 0                 # no recompute
    assert plugin.num_steps <= MAX_STEP_RATIO * stock.num_steps, (plugin, stock)
    for c in (plugin, stock):        # one observation per step: at most one token per slot in it
        assert c.num_steps >= c.num_generation_tokens / MAX_NUM_SEQS, c


def test_plugin_saw_tenants_and_classes(vllm_servers, burst_runs, vh):
    recs = vh.read_records(vllm_servers["records"])
    mine = [r for r in recs if r["tenant"] in ("heavy_a", "heavy_b", "light")]
    assert len(mine) >= RUNS * (2 * NUM_HEAVY + NUM_LIGHT)
    assert {r["class"] for r in mine if r["tenant"] == "light"} == {"interactive"}
    assert {r["class"] for r in mine if r["tenant"] != "light"} == {"batch"}
    assert all(r["status"] == "finished" and r["charged"] > 0 for r in mine)


def test_greedy_outputs_identical_with_and_without_plugin(vllm_servers):
    prompts = ["The capital of France is", "def fibonacci(n):", "Three facts about the moon:"]
    outs = {}
    for name in ("stock", "plugin"):
        outs[name] = []
        for p in prompts:                                   # one at a time: the same batches
            r = httpx.post(vllm_servers[name].url + "/v1/completions", timeout=120, json={
                "model": "smollm2", "prompt": p, "max_tokens": 24, "temperature": 0.0,
                "vllm_xargs": {"tenant": "light"}})
            assert r.status_code == 200, r.text
            outs[name].append(r.json()["choices"][0]["text"])
    assert outs["plugin"] == outs["stock"]
    assert all(len(t) > 0 for t in outs["stock"])


def test_held_back_by_concurrency_quota_not_lost(vllm_servers):
    """Tenant ``capped`` (max_concurrency 1) sends 3 at once: vLLM runs them one after the
    other (the others hidden from its queue), and all three finish."""
    res = run_burst(vllm_servers["plugin"].url, [TenantLoad("capped", 3, 1, 8)])
    assert [r.status for r in res] == ["finished"] * 3
    spans = sorted((r.first_token_s, r.token_s[-1]) for r in res)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 0.05                          # never two at once


def test_an_overdue_request_evicts_a_running_one(vllm_servers, vh):
    """Six long requests fill the plugin's six slots; a request of class ``urgent``
    (max_wait_s 0.5) arriving 1 s later starts once overdue, by evicting the policy's victim
    through vLLM's own preemption (recomputed later, finished), instead of waiting for a slot
    to free (as long as the long requests take)."""
    res = run_burst(vllm_servers["plugin"].url, [TenantLoad("long", MAX_NUM_SEQS, 5, 160),
                                                 TenantLoad("vip", 1, 1, 8, start_s=1.0, klass="urgent")])
    assert [r.status for r in res] == ["finished"] * (MAX_NUM_SEQS + 1), [r.reason for r in res]
    vip = next(r for r in res if r.tenant == "vip")
    first_free = min(r.token_s[-1] for r in res if r.tenant == "long")     # a slot's natural end
    assert vip.first_token_s < first_free, (vip.first_token_s, first_free)
    recs = [r for r in vh.read_records(vllm_servers["records"]) if r["tenant"] in ("long", "vip")]
    assert sum(r["preemptions"] for r in recs if r["tenant"] == "long") >= 1, recs
    assert all(r["status"] == "finished" for r in recs) and len(recs) == MAX_NUM_SEQS + 1

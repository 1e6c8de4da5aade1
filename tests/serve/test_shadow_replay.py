"""``tokenfair shadow`` on a recorded gateway run (real HTTP on loopback, the fake backend):
replayed under the live contract, the simulator reproduces the live per-tenant P99 TTFT."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.contracts.contract import parse_contract
from tokenfair.serve.auth import hash_key
from tokenfair.workloads.workload import TraceRow

KEYS = {"a": "key-a", "b": "key-b"}
SLOTS = 4                   # the backend's concurrency = the gateway's window = engine.max_running
TOKEN_DELAY_S = 0.05        # the fake backend's first token, like every next one, takes one "step"


def live_contract() -> dict:
    return {"version": "live-1", "engine": {"max_running": SLOTS},
            "admission": {"shed_over_max_wait": False},
            "tenants": {t: {"weight": 1.0, "api_key_sha256": [hash_key(k)]} for t, k in KEYS.items()}}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway, WindowConfig
    from tokenfair.serve.jobs import RecordSink
    from tokenfair.serve.load import LoadConfig, run_load
    from tokenfair.serve.shutdown import ServerThread

    d = tmp_path_factory.mktemp("shadow")
    fb = ServerThread(create_fake_backend(concurrency=SLOTS, token_delay_s=TOKEN_DELAY_S, ttft_s=TOKEN_DELAY_S)).start()
    c = parse_contract(live_contract())
    gw = Gateway(c, KeyRing(c), [fb.url], window=WindowConfig(initial=SLOTS, min=SLOTS, max=SLOTS),
                 records=RecordSink(d / "records.jsonl"))
    gt = ServerThread(create_app(gw), gw).start()
    # for 2 s both tenants ask for more than their half of the backend (each request holds a
    # slot ~0.55 s: a wants 5.5 slots, b 3.9 of the 4): both queue, TTFT grows past a second.
    # Steps of 50 ms keep the HTTP hops' jitter on a busy machine small next to them.
    rows = [TraceRow(f"a{k}", k / 10, "a", 10, 10, max_tokens=10) for k in range(20)]
    rows += [TraceRow(f"b{k}", 0.04 + k / 7, "b", 10, 10, max_tokens=10) for k in range(14)]
    rows.sort(key=lambda r: r.arrival_s)
    try:
        recs, _, _ = run_load(rows, LoadConfig(url=gt.url, keys=KEYS, timeout_s=60), c)
    finally:
        gt.stop()
        fb.stop()
    assert all(r["status"] == "finished" for r in recs)
    (d / "live.yaml").write_text(yaml.safe_dump(live_contract()))
    cand = live_contract()
    cand["version"] = "cand-1"
    cand["tenants"]["a"]["weight"] = 3.0
    (d / "cand.yaml").write_text(yaml.safe_dump(cand))
    return d


def test_shadow_reproduces_live_p99_ttft_within_15_percent(recorded):
    d = recorded
    res = CliRunner().invoke(app, ["shadow", str(d / "records.jsonl"), "--candidate", str(d / "cand.yaml"),
                                   "--live", str(d / "live.yaml"), "--out", str(d / "out")])
    assert res.exit_code in (0, 1), res.output
    assert "simulator error under the live contract" in res.output
    doc = json.loads((d / "out" / "shadow.json").read_text())
    assert doc["live"].startswith("live-1@") and doc["candidate"].startswith("cand-1@")
    assert doc["profile"]["name"] == "fitted-from-records"
    assert doc["calibration"]["rounds"] >= 1 and "calibrated by" in res.output
    assert abs(doc["calibration"]["tpot_error"]) < 0.2       # the last replay was already close
    assert "sim error" in res.output                         # the error sits next to each delta
    assert doc["profile"]["decode_seq_s"] * SLOTS < TOKEN_DELAY_S      # the backend's batch does not slow it
    p99 = {e["tenant"]: e for e in doc["simulator_error"] if e["figure"] == "ttft_p99_s"}
    assert set(p99) == {"a", "b"}
    for t, e in p99.items():
        assert e["recorded"] > 0.3, e          # the run did queue
        assert abs(e["rel_error"]) <= 0.15, (t, e)
    # the candidate favours a: its simulated P99 TTFT falls relative to the live contract's
    assert (d / "out" / "candidate" / "summary.json").exists()
    sim_live = json.loads((d / "out" / "live" / "summary.json").read_text())
    sim_cand = json.loads((d / "out" / "candidate" / "summary.json").read_text())
    assert sim_cand["tenants"]["a"]["ttft_s"]["p99"] < sim_live["tenants"]["a"]["ttft_s"]["p99"]


def test_shadow_bad_input(recorded, tmp_path):
    d = recorded
    r = CliRunner()
    res = r.invoke(app, ["shadow", str(d / "records.jsonl"), "--candidate", str(d / "cand.yaml")])
    assert res.exit_code == 2 and "give --live" in res.output and "live-1" in res.output
    res = r.invoke(app, ["shadow", str(tmp_path / "none.jsonl"), "--candidate", str(d / "cand.yaml"),
                         "--live", str(d / "live.yaml")])
    assert res.exit_code == 2 and "no such records file" in res.output
    # the store resolves the records' own version
    store = tmp_path / "store"
    assert r.invoke(app, ["contract", "apply", str(d / "live.yaml"), "--store", str(store)]).exit_code == 0
    res = r.invoke(app, ["shadow", str(d / "records.jsonl"), "--candidate", str(d / "cand.yaml"), "--store", str(store)])
    assert res.exit_code in (0, 1) and "live live-1@" in res.output

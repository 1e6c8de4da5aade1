"""Every public trace in ../shared/traces replays through the simulator (a slice each): every
request ends exactly once, in a terminal state with a reason."""

import json
import subprocess
import sys

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.traces import limit, load_workload

pytestmark = pytest.mark.usefixtures("public_traces")

TRACES = ["azure:code", "azure:conv", "azure", "mooncake", "mooncake:synthetic", "vtc", "servegen"]


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("policy", ["fifo", "fair"])
def test_public_trace_replays(name, policy):
    kwargs = {"duration_s": 120, "max_clients": 10, "rate_scale": 0.05} if name == "servegen" else {}
    wl = limit(load_workload(name, seed=0, **kwargs), 400)
    assert len(wl.rows) >= 100
    out = simulate(wl, policy, parse_contract({}), load_profile(None), isolated=False)
    ids = [r["request_id"] for r in out.records]
    assert sorted(ids) == sorted(r.request_id for r in wl.rows)
    assert all(r["status"] in ("finished", "rejected", "expired", "failed") and r["reason"] for r in out.records)
    finished = [r for r in out.records if r["status"] == "finished"]
    assert finished and all(r["first_token_s"] >= r["arrival_s"] for r in finished)


def test_cli_remaps_tenants(tmp_path):
    mapping = tmp_path / "map.yaml"
    mapping.write_text("code: coding\nconv: chat\n")
    res = subprocess.run([sys.executable, "-m", "tokenfair", "simulate", "azure", "--max-requests", "200",
                          "--remap-tenants", str(mapping), "--no-isolated", "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in (tmp_path / "o" / "requests.jsonl").read_text().splitlines()]
    assert {r["tenant"] for r in recs} <= {"coding", "chat"} and len(recs) == 200
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    res = subprocess.run([sys.executable, "-m", "tokenfair", "simulate", "azure", "--remap-tenants", str(bad),
                          "--out", str(tmp_path / "o2")], capture_output=True, text=True)
    assert res.returncode == 2 and "mapping" in res.stderr

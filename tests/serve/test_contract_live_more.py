"""Live contract changes on a real gateway (loopback), continued: every section of the contract
changed under load, the change log kept in a contract store across a restart, and a canary
rolled back on the live gate's in-time goodput."""

from __future__ import annotations

import httpx
import pytest
from test_contract_live import ADMIN, contract, fire, stack, yaml_body  # noqa: F401 (stack: a fixture)

from tokenfair.contracts.contract import parse_contract
from tokenfair.serve.auth import hash_key
from tokenfair.evaluation.thresholds import parse_thresholds



def test_every_section_changes_live_under_load(stack, h):
    """Classes (a min share added, a max wait changed), costs, engine budgets and a new tenant
    with its key: applied while requests queue; nothing is aborted; new requests follow v2."""
    gw, gt = stack
    done: list[httpx.Response] = []
    threads = fire(gt.url, "a", 10, done) + fire(gt.url, "b", 10, done)
    assert h.wait_until(lambda: gw.policy.num_waiting() >= 4, 10)
    v2 = contract("v2")
    v2["tenants"]["c"] = {"weight": 2.0, "api_key_sha256": [hash_key("key-c")]}
    v2["classes"] = {"interactive": {"priority": 20, "aging_rate": 1, "max_wait_s": 45, "min_share": 0.3},
                     "batch": {"priority": 0}}
    v2["costs"] = {"prefill_token": 0.5, "decode_token": 4.0}
    v2["engine"] = {"max_running": 3, "prefill_token_budget": 1024, "chunk_size": 256}
    r = httpx.post(gt.url + "/admin/contract", content=yaml_body(v2), headers=ADMIN)
    assert r.status_code == 200, r.text
    p = gw.policy
    assert p.queue.class_min == {"interactive": 0.3} and p.queue.class_waiting["interactive"] == p.num_waiting()
    assert p.costs.wd == 4.0 and p.admission.max_running == 3 and "batch" in gw.metrics.classes
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4},
                   headers={"Authorization": "Bearer key-c"}, timeout=30)
    assert r.status_code == 200 and r.headers["x-tokenfair-tenant"] == "c"      # the new key works at once
    for t in threads:
        t.join(30)
    assert all(x.status_code == 200 for x in done)
    assert h.wait_until(lambda: len(gw.records.items) == 21, 5)
    recs = {x["request_id"]: x for x in gw.records.items}
    assert recs[r.headers["x-request-id"]]["max_wait_s"] == 45 and recs[r.headers["x-request-id"]]["contract_version"] == "v2"
    assert {x["max_wait_s"] for x in recs.values() if x["contract_version"] == "v1"} == {30}   # kept what admitted them
    assert all(x["status"] == "finished" for x in recs.values())


def stored_service(store):
    """A function that starts a gateway on contract v1 with its live log in ``store``
    (called again: a restart)."""
    from tokenfair.serve.admin import configure_live
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway

    c = parse_contract(contract("v1"))

    def service():
        gw = Gateway(c, KeyRing(c), ["http://127.0.0.1:9"])
        return gw, configure_live(gw, admin_key_sha256=hash_key("admin-secret"), store=store)
    return service


def test_changes_are_logged_in_the_store_and_survive_a_restart(tmp_path, h):
    """--contract-store: applies, a canary's rollback and refusals go to DIR/live.jsonl; a new
    service reads them back; `contract history` lists them; a label the store holds with other
    content is refused."""
    from typer.testing import CliRunner

    from tokenfair.cli.app import app
    store = tmp_path / "store"
    service = stored_service(store)
    gw, live = service()
    live.apply(parse_contract(contract("v2", a={"weight": 2})), "apply", "more for a")
    live.rollback("v2 starved b")
    clash = parse_contract(contract("v2", a={"weight": 5}))            # v2 again, other content
    with pytest.raises(Exception, match="already in the store"):
        live.apply(clash)
    assert gw.contract.version == "v1"
    assert (store / "versions" / "v2.yaml").exists() and (store / "versions" / "v1.yaml").exists()
    gw2, live2 = service()                                              # a restart
    assert [e.event for e in live2.events] == ["start", "apply", "rollback", "start"]
    assert live2.events[2].reason == "v2 starved b" and live2.events[1].version.startswith("v2@")
    res = CliRunner().invoke(app, ["contract", "history", "--store", str(store)])
    assert res.exit_code == 0, res.output
    assert "live changes" in res.output and "v2 starved b" in res.output and "more for a" in res.output
    res = CliRunner().invoke(app, ["contract", "show", "v2", "--store", str(store)])
    assert res.exit_code == 0 and "weight: 2.0" in res.output


def test_rollback_works_across_a_restart(tmp_path):
    """The rollback stack is rebuilt from the store's live log: after a restart (with the file
    the service first started with) a rollback returns to what was in force before it, then
    to the versions before that, in order."""
    from tokenfair.serve.contract_events import previous_labels

    service = stored_service(tmp_path / "store")
    gw, live = service()
    live.apply(parse_contract(contract("v2", a={"weight": 2})), "apply", "a up")
    live.apply(parse_contract(contract("v3", a={"weight": 3})), "apply", "a up again")
    live.rollback("v3 starved b")
    live.apply(parse_contract(contract("v4", a={"weight": 4})), "apply", "a to 4")
    gw2, live2 = service()                                  # restarted from the v1 file
    assert [x.version for x in live2.previous] == ["v1", "v2", "v4"]
    live2.rollback("back to before the restart")
    assert gw2.contract.version == "v4"
    live2.rollback("and before that")
    assert gw2.contract.version == "v2"
    assert previous_labels([{"event": "start", "version": "a@1", "time_s": 0},
                            {"event": "refused", "version": "a@1", "time_s": 1}], "a@1") == []


def test_canary_rolls_back_on_in_time_goodput(stack, h):
    """The live gate's min_goodput_fraction: a candidate under which the requests it admits miss
    their SLOs (an unmeetable TTFT SLO) is rolled back at the next evaluation, the reason named."""
    gw, gt = stack
    gw.live.thresholds = parse_thresholds({"scenarios": {"live": {"min_goodput_fraction": 0.5}}})
    cand = contract("v2-slo")
    cand["classes"] = {"interactive": {"priority": 20, "max_wait_s": 30, "ttft_slo_s": 0.0001}}
    r = httpx.post(gt.url + "/admin/contract?canary_s=60&eval_s=0.3", content=yaml_body(cand), headers=ADMIN)
    assert r.status_code == 200 and r.json()["canary"]["state"] == "watching"
    out: list[httpx.Response] = []
    for t in fire(gt.url, "b", 3, out):
        t.join(30)
    assert all(x.status_code == 200 for x in out)
    # the server's loop swaps the contract, then logs the event: wait for the event
    assert h.wait_until(lambda: gw.live.events[-1].event == "rollback", 5)
    last = gw.live.events[-1]
    assert gw.contract.version == "v1" and "goodput_fraction=0" in last.reason

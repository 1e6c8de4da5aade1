"""Live contract changes on a real gateway (loopback) in front of the fake backend: reload under
load, a refused bad contract, rollback, a canary that rolls back by itself, removed tenants,
the contract header, the info metric and the version in every record."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.serve.auth import hash_key
from tokenfair.evaluation.thresholds import parse_thresholds

ADMIN = {"Authorization": "Bearer admin-secret"}
KEYS = {"a": "key-a", "b": "key-b", "light": "key-light"}


def contract(version: str, **tenant_over):
    tenants = {t: {"weight": 1.0, "api_key_sha256": [hash_key(k)]} for t, k in KEYS.items()}
    for t, over in tenant_over.items():
        if over is None:
            tenants.pop(t)
        else:
            tenants[t] = {**tenants[t], **over}
    return {"version": version, "tenants": tenants}


def yaml_body(d: dict) -> str:
    import yaml
    return yaml.safe_dump(d)


def key(t: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[t]}"}


@pytest.fixture()
def stack(tmp_path):
    from tokenfair.serve.admin import configure_live
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway, WindowConfig
    from tokenfair.serve.shutdown import ServerThread

    fb = ServerThread(create_fake_backend(concurrency=2, token_delay_s=0.01)).start()
    c = parse_contract(contract("v1"))
    gw = Gateway(c, KeyRing(c), [fb.url], window=WindowConfig(initial=2, min=1, max=2))
    th = parse_thresholds({"scenarios": {"live": {"max_rejection_rate": 0.1}}})
    configure_live(gw, admin_key_sha256=hash_key("admin-secret"), thresholds=th, store=tmp_path / "store")
    gt = ServerThread(create_app(gw), gw).start()
    yield gw, gt
    gt.stop()
    fb.stop()


def fire(url: str, tenant: str, n: int, out: list, max_tokens: int = 8) -> list[threading.Thread]:
    def one(i: int) -> None:
        r = httpx.post(url + "/v1/completions", json={"prompt": f"hello {i}", "max_tokens": max_tokens},
                       headers=key(tenant), timeout=30)
        out.append(r)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_reload_under_load_loses_and_aborts_nothing(stack, h):
    gw, gt = stack
    v1 = gw.contract.content_hash
    done: list[httpx.Response] = []
    threads = fire(gt.url, "a", 12, done) + fire(gt.url, "b", 12, done)
    assert h.wait_until(lambda: gw.policy.num_waiting() >= 4, 10)      # a queue has formed
    r = httpx.post(gt.url + "/admin/contract", content=yaml_body(contract("v2", a={"weight": 3.0})), headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == "v2" and r.headers["x-tokenfair-contract"].startswith("v2@")
    assert gw.policy.tenants["a"].weight == 3.0          # the queued tenant took its new weight
    late: list[httpx.Response] = []
    threads += fire(gt.url, "a", 4, late)
    for t in threads:
        t.join(30)
    assert all(x.status_code == 200 for x in done + late), [x.text for x in done + late if x.status_code != 200]
    assert all(x.headers["x-tokenfair-contract"].count("@") == 1 for x in done + late)
    assert h.wait_until(lambda: len(gw.records.items) == 28, 5)
    recs = list(gw.records.items)
    ids = [x["request_id"] for x in recs]
    assert len(set(ids)) == 28 and all(x["status"] == "finished" for x in recs)     # each ended once
    versions = {x["request_id"]: (x["contract_version"], x["contract_hash"]) for x in recs}
    late_ids = {x.headers["x-request-id"] for x in late}
    assert {versions[i][0] for i in late_ids} == {"v2"}
    # requests admitted before the reload were recorded with v1, and they all finished
    assert ("v1", v1) in set(versions.values())
    assert all(x["max_tokens"] == 8 for x in recs)
    metrics = httpx.get(gt.url + "/metrics").text
    assert f'tokenfair_contract_info{{hash="{gw.contract.content_hash}",version="v2"}} 1.0' in metrics


def test_bad_contract_is_refused_and_the_old_one_keeps_serving(stack):
    gw, gt = stack
    before = f"v1@{gw.contract.content_hash}"
    r = httpx.post(gt.url + "/admin/contract", content="version: v9\ntenants: {a: {weight: -1}}\n", headers=ADMIN)
    assert r.status_code == 400 and "tenants.a.weight" in r.json()["error"]["message"]
    assert before in r.json()["error"]["message"] and r.headers["x-tokenfair-contract"] == before
    r = httpx.post(gt.url + "/admin/contract", content="{not yaml", headers=ADMIN)
    assert r.status_code == 400
    # a key listed for two tenants is refused the same way
    bad = contract("v9")
    bad["tenants"]["b"]["api_key_sha256"] = [hash_key(KEYS["a"])]
    r = httpx.post(gt.url + "/admin/contract", content=yaml_body(bad), headers=ADMIN)
    assert r.status_code == 400 and before in r.json()["error"]["message"]
    # tenant keys never open the admin endpoints
    assert httpx.post(gt.url + "/admin/contract", content=yaml_body(contract("v3")), headers=key("a")).status_code == 401
    assert httpx.get(gt.url + "/admin/contract").status_code == 401
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key("a"), timeout=10)
    assert r.status_code == 200 and r.headers["x-tokenfair-contract"] == before
    state = httpx.get(gt.url + "/admin/contract", headers=ADMIN).json()
    assert state["contract"] == before and [e["event"] for e in state["events"]].count("refused") == 3


def test_rollback_and_removed_tenants(stack):
    gw, gt = stack
    # v2 removes tenant light: its key gets a clear refusal naming the version
    v2 = contract("v2", light=None)
    assert httpx.post(gt.url + "/admin/contract", content=yaml_body(v2), headers=ADMIN).status_code == 200
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key("light"))
    assert r.status_code == 401 and "tenant_removed" in r.json()["error"]["message"] and "'v2'" in r.text
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key("b"), timeout=10)
    assert r.status_code == 200 and r.headers["x-tokenfair-tenant"] == "b"      # the others go on
    # keys under default_tenant are refused (a key names one tenant)
    v3 = contract("v3", light=None)
    v3["default_tenant"] = {"weight": 0.5, "api_key_sha256": [hash_key(KEYS["light"])]}
    r = httpx.post(gt.url + "/admin/contract", content=yaml_body(v3), headers=ADMIN)
    assert r.status_code == 400 and "default_tenant" in r.json()["error"]["message"]
    # removed_tenants: default_template -- the removed tenant's key goes on, under the default template
    v4 = contract("v4", light=None)
    v4["removed_tenants"] = "default_template"
    v4["default_tenant"] = {"weight": 0.5}
    assert httpx.post(gt.url + "/admin/contract", content=yaml_body(v4), headers=ADMIN).status_code == 200
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key("light"), timeout=10)
    assert r.status_code == 200 and r.headers["x-tokenfair-tenant"] == "light"
    assert gw.policy.tenants["light"].weight == 0.5 and "light" not in gw.contract.tenants
    r = httpx.post(gt.url + "/admin/contract/rollback", headers=ADMIN)
    assert r.status_code == 200 and r.json()["version"] == "v2"
    r = httpx.post(gt.url + "/admin/contract/rollback", headers=ADMIN)
    assert r.status_code == 200 and r.json()["version"] == "v1"
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key("light"), timeout=10)
    assert r.status_code == 200 and r.headers["x-tokenfair-contract"].startswith("v1@")
    assert httpx.post(gt.url + "/admin/contract/rollback", headers=ADMIN).status_code == 409


def test_canary_breach_rolls_back_within_one_evaluation_period(stack, h):
    gw, gt = stack
    eval_s = 0.5
    # the candidate caps tenant a at one running and one queued request: a burst gets 429s
    cand = contract("v2-canary", a={"max_concurrency": 1, "max_queued": 1})
    r = httpx.post(gt.url + f"/admin/contract?canary_s=60&eval_s={eval_s}", content=yaml_body(cand), headers=ADMIN)
    assert r.status_code == 200 and r.json()["canary"]["state"] == "watching"
    out: list[httpx.Response] = []
    threads = fire(gt.url, "a", 8, out, max_tokens=20)
    assert h.wait_until(lambda: any(x.status_code == 429 for x in out), 10)     # the breach happens
    rejected_at = time.monotonic()
    assert h.wait_until(lambda: gw.contract.version == "v1", 3 * eval_s)
    assert time.monotonic() - rejected_at <= eval_s + 0.5          # within one evaluation period (+ slack)
    for t in threads:
        t.join(30)
    assert all(x.status_code in (200, 429) for x in out) and len(out) == 8
    state = httpx.get(gt.url + "/admin/contract", headers=ADMIN).json()
    last = state["events"][-1]
    assert last["event"] == "rollback" and "canary breach" in last["reason"] and "rejection_rate" in last["reason"]
    assert state["canary"] is None
    # the canary and its rollback, with the reason, are in the store's live log (survive a restart)
    from tokenfair.serve.contract_events import read_live_log
    logged = read_live_log(gw.live.log.path)
    assert [d["event"] for d in logged][-2:] == ["canary", "rollback"] and logged[-1]["reason"] == last["reason"]
    assert logged[-2]["version"].startswith("v2-canary@") and logged[-1]["mode"] == "gateway"


def test_canary_that_holds_is_kept(stack, h):
    gw, gt = stack
    r = httpx.post(gt.url + "/admin/contract?canary_s=1&eval_s=0.25", content=yaml_body(contract("v2", b={"weight": 2})),
                   headers=ADMIN)
    assert r.status_code == 200
    out: list[httpx.Response] = []
    for t in fire(gt.url, "b", 3, out):
        t.join(30)
    assert all(x.status_code == 200 for x in out)
    assert h.wait_until(lambda: gw.live.events[-1].event == "canary_passed", 5)
    assert gw.contract.version == "v2"
    r = httpx.post(gt.url + "/admin/contract?canary_s=-1", content=yaml_body(contract("v3")), headers=ADMIN)
    assert r.status_code == 400 and "canary_s" in r.text and gw.contract.version == "v2"


def test_reload_file_and_records_rotation(tmp_path):
    from tokenfair.workloads.records import read_records, record_files, records_workload
    from tokenfair.serve.admin import configure_live
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.records_sink import RotatingRecordSink

    path = tmp_path / "c.yaml"
    path.write_text(yaml_body(contract("f1")))
    c = parse_contract(contract("f1"))
    sink = RotatingRecordSink(tmp_path / "rec.jsonl", max_bytes=600, keep_files=3)
    gw = Gateway(c, KeyRing(c), ["http://127.0.0.1:9"], records=sink)
    live = configure_live(gw, contract_path=path)
    path.write_text(yaml_body(contract("f2", a={"weight": 2})))
    assert live.reload_file().event == "reload" and gw.contract.version == "f2"
    path.write_text("version: f3\ntenants: {a: {min_share: 2}}\n")
    ev = live.reload_file()
    assert ev.event == "refused" and "min_share" in ev.reason and gw.contract.version == "f2"
    for i in range(12):
        sink.add({"request_id": f"r{i}", "arrival_s": 10.0 + i, "tenant": "a", "class": "interactive",
                  "prompt_tokens": 5, "output_tokens": 3 if i % 4 else 0, "status": "finished" if i % 4 else "rejected",
                  "max_tokens": 16, "deadline_s": None, "mode": "gateway", "http_status": 200,
                  "contract_version": "f2"})
    files = record_files(tmp_path / "rec.jsonl")
    assert len(files) == 4 and files[-1].name == "rec.jsonl" and files[0].name == "rec.jsonl.3"
    assert all(f.stat().st_size <= 600 for f in files)
    recs = read_records(tmp_path / "rec.jsonl")
    ids = [r["request_id"] for r in recs]
    assert ids == sorted(ids, key=lambda x: int(x[1:])) and ids[-1] == "r11"     # oldest first, the oldest dropped
    wl = records_workload(tmp_path / "rec.jsonl")
    assert wl.rows[0].arrival_s == 0.0 and {r.max_tokens for r in wl.rows} == {16}
    rejected = [r for r in wl.rows if r.request_id == "r8"][0]
    assert rejected.output_tokens == 16           # no true length: min(max_tokens, 256)


def test_sighup_rereads_the_contract_file(tmp_path, h):
    """A real `tokenfair gateway` process: SIGHUP applies the edited file; a bad edit is refused."""
    import os
    import signal
    import subprocess
    import sys

    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread, free_port

    fb = ServerThread(create_fake_backend(concurrency=2, token_delay_s=0.001)).start()
    path = tmp_path / "c.yaml"
    path.write_text(yaml_body(contract("h1")))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tokenfair", "gateway", "--backend", fb.url, "--contract", str(path),
                             "--port", str(port), "--admin-key-sha256", hash_key("admin-secret"),
                             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"

    def version() -> str:
        try:
            return httpx.get(url + "/healthz", timeout=2).headers.get("x-tokenfair-contract", "")
        except httpx.HTTPError:
            return ""
    try:
        assert h.wait_until(lambda: version().startswith("h1@"), 30), proc.stderr.read1().decode() if proc.poll() else ""
        path.write_text(yaml_body(contract("h2", a={"weight": 2})))
        os.kill(proc.pid, signal.SIGHUP)
        assert h.wait_until(lambda: version().startswith("h2@"), 10)
        path.write_text("version: h3\ntenants: {a: {weight: 0}}\n")
        os.kill(proc.pid, signal.SIGHUP)
        assert h.wait_until(lambda: httpx.get(url + "/admin/contract", headers=ADMIN).json()["events"][-1]["event"]
                            == "refused", 10)
        assert version().startswith("h2@") and proc.poll() is None
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key("a"), timeout=10)
        assert r.status_code == 200 and r.headers["x-tokenfair-contract"].startswith("h2@")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        fb.stop()


def test_serve_engine_takes_a_live_contract(tiny_model_dir, h):
    """`serve` (the real engine): the scheduler and its policy switch under the engine lock."""
    svc, st = h.start_serve(tiny_model_dir)
    try:
        body = {"prompt": "the quick brown fox", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        r = httpx.post(st.url + "/v1/completions", json=body, headers=h.auth("a"), timeout=30)
        assert r.status_code == 200 and r.headers["x-tokenfair-contract"].startswith("serve-test@")
        d = svc.contract.model_dump(mode="json")
        d["version"] = "serve-v2"
        d["tenants"]["a"]["weight"] = 4.0
        d["engine"]["max_running"] = 8
        svc.live.apply(parse_contract(d))
        assert svc.sched.contract.engine.max_running == 8 and svc.policy.tenants["a"].weight == 4.0
        r = httpx.post(st.url + "/v1/completions", json=body, headers=h.auth("a"), timeout=30)
        assert r.status_code == 200 and r.headers["x-tokenfair-contract"].startswith("serve-v2@")
        recs = {x["request_id"]: x for x in svc.records.items}
        assert recs[r.headers["x-request-id"]]["contract_version"] == "serve-v2"
        assert [x["contract_version"] for x in recs.values()] == ["serve-test", "serve-v2"]
    finally:
        st.stop()


def test_cli_push_canary_wait_and_live_rollback(stack, h, tmp_path):
    from typer.testing import CliRunner

    from tokenfair.cli.app import app
    gw, gt = stack
    r = CliRunner()
    env = {"TOKENFAIR_ADMIN_KEY": "admin-secret"}
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml_body(contract("c-good", b={"weight": 2})))
    bad.write_text(yaml_body(contract("c-bad", a={"max_concurrency": 1, "max_queued": 1})))
    res = r.invoke(app, ["contract", "push", str(good), "--url", gt.url, "--canary-s", "0.6", "--eval-s", "0.2",
                         "--wait"], env=env)
    assert res.exit_code == 0 and "held" in res.output, res.output
    # a burst from tenant a as soon as the bad canary is live: it is rolled back, exit 1
    out: list[httpx.Response] = []

    def burst() -> None:
        if h.wait_until(lambda: gw.live.canary is not None, 10):
            for t in fire(gt.url, "a", 8, out, max_tokens=20):
                t.join(30)
    th = threading.Thread(target=burst)
    th.start()
    res = r.invoke(app, ["contract", "push", str(bad), "--url", gt.url, "--canary-s", "30", "--eval-s", "0.3",
                         "--wait"], env=env)
    th.join(30)
    assert res.exit_code == 1 and "did not hold" in res.output and "rejection_rate" in res.output, res.output
    assert gw.contract.version == "c-good"
    res = r.invoke(app, ["contract", "live-rollback", "--url", gt.url], env=env)
    assert res.exit_code == 0 and "in force: v1@" in res.output
    res = r.invoke(app, ["contract", "live", "--url", gt.url], env={"TOKENFAIR_ADMIN_KEY": "wrong"})
    assert res.exit_code == 2 and "HTTP 401" in res.output


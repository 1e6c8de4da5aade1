"""Graceful shutdown of ``serve``, and the bounded metric labels."""

from __future__ import annotations

import threading
import time

import httpx


def test_graceful_shutdown_ends_every_request(tiny_model_dir, h, monkeypatch):
    svc, st = h.start_serve(tiny_model_dir, grace_s=0.3)
    execute = svc.engine.execute

    def slow(out):
        time.sleep(0.005)
        return execute(out)
    monkeypatch.setattr(svc.engine, "execute", slow)
    url = st.url + "/v1/completions"
    lines: list[str] = []
    first = threading.Event()
    results: dict = {}

    def stream_long():
        with httpx.stream("POST", url, headers=h.auth("q"), timeout=30,
                          json={"prompt": "the lazy dog", "max_tokens": 230, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    first.set()

    def queued():
        r = httpx.post(url, headers=h.auth("q"), timeout=30, json={"prompt": "x", "max_tokens": 3})
        results["queued"] = (r.status_code, r.json())

    t1 = threading.Thread(target=stream_long, daemon=True)
    t1.start()
    assert first.wait(20)
    t2 = threading.Thread(target=queued, daemon=True)
    t2.start()
    assert h.wait_until(lambda: svc.policy.tenants["q"].num_waiting == 1)
    # what GracefulServer does first: stop accepting -> 503 with Retry-After
    svc.begin_shutdown()
    r = httpx.post(url, headers=h.auth("a"), json={"prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down" and "retry-after" in r.headers
    assert httpx.get(st.url + "/healthz").status_code == 503
    t0 = time.monotonic()
    st.stop()
    assert time.monotonic() - t0 < 15
    t1.join(10)
    t2.join(10)
    assert not t1.is_alive() and not t2.is_alive()
    # the long stream was cut at the end of the grace period with an error event, then [DONE]
    assert lines[-1] == "[DONE]" and '"shutdown' in lines[-2]
    status, body = results["queued"]
    assert status in (200, 503)
    if status == 503:
        assert body["error"]["code"] == "shutdown"
    recs = list(svc.records.items)
    assert len({r["request_id"] for r in recs}) == len(recs) == 3
    assert {r["status"] for r in recs} <= {"finished", "failed", "rejected"}
    assert all(r["reason"] for r in recs)
    assert not svc.jobs and not svc.worker.thread.is_alive()
    assert svc.sched.pool.num_free == svc.sched.pool.num_blocks


def test_tenant_labels_capped():
    from tokenfair.contracts.contract import parse_contract
    from tokenfair.core.reasons import ReasonCode
    from tokenfair.serve.metrics import OTHER, ServiceMetrics, TenantLabels

    c = parse_contract({"tenants": {"big": {"weight": 5}, "small": {"weight": 1}}})
    lab = TenantLabels(c, max_tenants=3)
    assert lab("big") == "big" and lab("small") == "small"
    assert lab("new1") == "new1"
    assert lab("new2") == OTHER and lab("new3") == OTHER
    assert lab("new1") == "new1"
    m = ServiceMetrics(c, max_tenants=2)
    m.rejected("big", ReasonCode.QUEUE_FULL)
    for i in range(50):
        m.rejected(f"t{i}", ReasonCode.QUEUE_FULL)
    text = m.render().decode()
    tenants = {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("tokenfair_rejections_total{")}
    assert tenants == {"big", OTHER}      # the two labels go to the contract's named tenants


class _CrashingScheduler:
    """The service's scheduler with a bug in ``schedule`` (a compiled scheduler's methods
    cannot be patched on the object, so this stands in front of it)."""

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)

    def schedule(self, now):
        raise RuntimeError("simulated scheduler bug")

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def test_worker_crash_fails_requests_never_hangs(tiny_model_dir, h, monkeypatch):
    svc, st = h.start_serve(tiny_model_dir)
    try:
        monkeypatch.setattr(svc.worker, "sched", _CrashingScheduler(svc.sched))
        r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=10,
                       json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
        assert h.wait_until(lambda: not svc.worker.thread.is_alive(), 5)
        r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=10,
                       json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend"
        assert httpx.get(st.url + "/healthz").status_code == 503
        assert [x["status"] for x in svc.records.items] == ["failed", "rejected"]
    finally:
        st.stop()

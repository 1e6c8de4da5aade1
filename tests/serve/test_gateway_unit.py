"""Gateway mechanics: the adaptive window, backend failures, 429/504 at the gateway, and
client disconnects, against fake backends on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from concurrency import call_at_once

from tokenfair.serve.gateway import AdaptiveWindow, WindowConfig, normalize_backend_url


def test_window_slow_start_then_aimd():
    w = AdaptiveWindow(WindowConfig(initial=2, min=1, max=16, tolerance=2.0, slack_s=0.0, beta=0.5))
    now = 0.0
    for _ in range(6):                       # fast responses while the window is in use: slow start
        now += 0.1
        w.on_first_token(0.1, 10, now - 0.1, inflight=w.limit, now=now)
    assert w.window == 8 and w.slow_start
    now += 0.1
    w.on_first_token(0.5, 10, released_s=now - 0.5, inflight=8, now=now)   # queueing: halve
    assert w.window == 4 and not w.slow_start
    w.on_first_token(0.5, 10, released_s=now - 0.5, inflight=4, now=now + 0.01)  # same round: no 2nd cut
    assert w.window == 4
    for _ in range(4):                       # additive increase: +1/window per response
        now += 0.1
        w.on_first_token(0.1, 10, now - 0.1, inflight=4, now=now)
    assert 4.9 < w.window < 5.1
    before = w.window
    w.on_first_token(0.1, 10, now, inflight=0, now=now + 0.1)             # idle window: no growth
    assert w.window == before
    for i in range(20):
        w.on_overload(released_s=now + i, now=now + i + 0.5)
    assert w.window == 1                     # never below min
    # a long prompt has its own baseline: a slow first token for it is not "queueing"
    w2 = AdaptiveWindow(WindowConfig(initial=4, slack_s=0.0))
    w2.on_first_token(0.05, 10, 0.0, 4, 0.1)
    w2.on_first_token(0.8, 2000, 0.0, 4, 0.9)
    assert w2.decreases == 0


def test_normalize_backend_url():
    assert normalize_backend_url("http://h:1") == "http://h:1/v1"
    assert normalize_backend_url("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(ValueError):
        normalize_backend_url("h:1")


def _gateway(h, backends, **kw):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), backends, **kw)
    return gw, ServerThread(create_app(gw, 2.0), gw, grace_s=2.0)


def _dead_url():
    from tokenfair.serve.shutdown import free_port
    return f"http://127.0.0.1:{free_port()}"


def test_no_backend_503(h):
    gw, st = _gateway(h, [_dead_url()])
    with st:
        r = httpx.post(st.url + "/v1/completions", json={"prompt": "x"}, headers=h.auth("a"), timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend"
        assert int(r.headers["retry-after"]) >= 1
        assert httpx.get(st.url + "/healthz").status_code == 503
    assert [r["status"] for r in gw.records.items] == ["rejected"]


def test_failover_requeues_to_live_backend(h):
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread

    live = ServerThread(create_fake_backend(concurrency=4, token_delay_s=0.001)).start()
    doomed = ServerThread(create_fake_backend(concurrency=4, token_delay_s=0.001)).start()
    gw, st = _gateway(h, [doomed.url, live.url])
    with st:
        doomed.stop()                      # goes away after the gateway saw it up

        def call(i):
            return httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=30,
                              json={"prompt": "x y", "max_tokens": 3}).status_code
        assert call_at_once(call, 6, 30) == [200] * 6
        assert not gw.backends[0].up and gw.backends[1].up
        assert sum(r["preemptions"] for r in gw.records.items) >= 1      # retried elsewhere
        assert all(r["status"] == "finished" for r in gw.records.items)
    live.stop()


class _Call(threading.Thread):
    def __init__(self, url, headers, body, stream=False, timeout=30.0):
        super().__init__(daemon=True)
        self.args_ = (url, headers, body, stream, timeout)
        self.status = None
        self.first = threading.Event()
        self.lines = []

    def run(self):
        url, headers, body, stream, timeout = self.args_
        try:
            with httpx.stream("POST", url, headers=headers, json={**body, "stream": stream}, timeout=timeout) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    self.lines.append(line)
                    if line.startswith("data: "):
                        self.first.set()
        except httpx.HTTPError as err:
            self.status = type(err).__name__
        self.first.set()


def test_gateway_queue_full_deadline_and_disconnects(h):
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread

    from tokenfair.serve.gateway_health import HealthConfig

    fake = create_fake_backend(concurrency=1, token_delay_s=0.02)
    with ServerThread(fake) as be:
        # probes that a loaded machine cannot fail: a backend marked down would drain the
        # running request this test cancels itself (tests/serve/test_gateway_health.py
        # tests the probes)
        lenient = HealthConfig(probe_timeout_s=30.0, probe_failures_down=10)
        gw, st = _gateway(h, [be.url], window=WindowConfig(initial=1, min=1, max=1), health=lenient)
        with st:
            url = st.url + "/v1/completions"
            # ~3 s: q's slot stays busy through the checks below however loaded the machine is
            busy = _Call(url, h.auth("q"), {"prompt": "p", "max_tokens": 150}, stream=True)
            busy.start()
            assert busy.first.wait(10)
            # q's only slot is busy: a tiny deadline cannot be met -> 504, fast
            t0 = time.monotonic()
            r = httpx.post(url, headers={**h.auth("q"), "x-tokenfair-deadline-s": "0.05"},
                           json={"prompt": "p", "max_tokens": 2}, timeout=10)
            assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_infeasible"
            assert time.monotonic() - t0 < 1.0
            queued = _Call(url, h.auth("q"), {"prompt": "p", "max_tokens": 2})
            queued.start()
            assert h.wait_until(lambda: gw.policy.tenants["q"].num_waiting == 1)
            r = httpx.post(url, headers=h.auth("q"), json={"prompt": "p", "max_tokens": 2}, timeout=10)
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
            assert r.headers["x-ratelimit-remaining-requests"] == "0" and "retry-after" in r.headers
            # a queued request whose client leaves frees its queue slot at once
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, headers=h.auth("a"), json={"prompt": "p", "max_tokens": 2},
                           timeout=httpx.Timeout(10, read=0.2))
            assert h.wait_until(lambda: any(x["tenant"] == "a" and x["reason"].startswith("client_disconnected")
                                            for x in gw.records.items), 5)
            busy.join(20)
            queued.join(20)
            assert busy.status == 200 and queued.status == 200
            # a running request whose client leaves is cancelled at the backend too
            with httpx.stream("POST", url, headers=h.auth("a"), timeout=10,
                              json={"prompt": "p", "max_tokens": 2000, "stream": True}) as resp:
                # 2,000 tokens take the backend 40 s: still running however slowly this client
                # reads.  The line iterator is kept open: leaving a ``for`` over it closes it,
                # and with it the connection, so the gateway could cancel before the check below
                lines = resp.iter_lines()
                got = 0
                while got < 2:
                    got += next(lines).startswith("data: ")
                stats = fake.state.stats
                assert h.wait_until(lambda: stats["active"] == 1, 5), \
                    {k: stats[k] for k in ("active", "served", "queued", "order")}
            assert h.wait_until(lambda: fake.state.stats["active"] == 0 and not gw.jobs, 5)
            # no held job: its record is written (JobBook.end records before it lets the job go)
            rec = [x for x in list(gw.records.items)
                   if x["output_tokens"] and x["reason"].startswith("client_disconnected")]
            assert rec and rec[-1]["status"] == "failed", list(gw.records.items)[-3:]
    statuses = [x["status"] for x in gw.records.items]
    assert statuses.count("expired") == 1 and statuses.count("rejected") == 1
    assert len({x["request_id"] for x in gw.records.items}) == len(statuses)


def test_contract_max_running_caps_gateway_inflight(h):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    c = h.service_contract()
    c = c.model_copy(update={"engine": c.engine.model_copy(update={"max_running": 1})})
    fake = create_fake_backend(concurrency=8, token_delay_s=0.002)
    with ServerThread(fake) as be:
        gw = Gateway(c, KeyRing(c), [be.url], window=WindowConfig(initial=8, max=8))
        with ServerThread(create_app(gw), gw) as st:
            calls = [_Call(st.url + "/v1/completions", h.auth("a" if i % 2 else "b"), {"prompt": "p", "max_tokens": 10})
                     for i in range(6)]
            for t in calls:
                t.start()
            for t in calls:
                t.join(20)
            assert [t.status for t in calls] == [200] * 6
    assert fake.state.stats["max_active"] == 1

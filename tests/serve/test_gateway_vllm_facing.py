"""What the gateway tells a vLLM backend (tenant, class, priority in the body) and the
saturation-driven window (vLLM's /metrics), against fake backends on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tokenfair.serve.backend_identity import tag_body, vllm_priority
from tokenfair.serve.gateway import WindowConfig
from tokenfair.serve.saturation import (Saturation, SaturationConfig, SaturationWindow, late_first_tokens,
                                        make_window, metrics_url, parse_vllm_metrics)

VLLM_PAGE = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 3.0
vllm:num_requests_running{engine="0",model_name="smollm2"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0
vllm:num_requests_waiting{engine="1",model_name="smollm2"} 1.0
vllm:kv_cache_usage_perc{engine="1",model_name="smollm2"} 0.75
"""


def test_tag_body_replaces_client_identity_and_maps_priority():
    body = {"prompt": "x", "vllm_xargs": {"tenant": "someone-else", "class": "realtime", "keep": 1},
            "priority": -100}
    out = tag_body(dict(body), "acme", "batch", 20.0, backend_priority=True)
    assert out["vllm_xargs"] == {"tenant": "acme", "class": "batch", "keep": 1}
    assert out["priority"] == -20 == vllm_priority(20.0)       # vLLM: lower is served first
    assert body["vllm_xargs"]["tenant"] == "someone-else"        # the client's dict is not mutated
    out = tag_body({"prompt": "x", "priority": -100, "vllm_xargs": "junk"}, "acme", "batch", 20.0,
                   backend_priority=False)
    assert "priority" not in out and out["vllm_xargs"] == {"tenant": "acme", "class": "batch"}


def test_parse_vllm_metrics_sums_engines_and_ignores_other_names():
    s = parse_vllm_metrics(VLLM_PAGE, now=1.0)
    assert s == Saturation(num_waiting=4.0, num_running=5.0, kv_usage=0.5, at_s=1.0)
    assert parse_vllm_metrics("tokenfair_requests_total 3\n", 0.0) is None
    assert metrics_url("http://h:1/v1") == "http://h:1/metrics"


def test_saturation_window_grows_until_the_backend_queues():
    cfg = WindowConfig(initial=2, min=1, max=64)
    w = SaturationWindow(cfg, SaturationConfig(growth=0.5, max_starting=4))
    assert isinstance(make_window(cfg, None), type(w.latency)) and not w.is_driven(0.0)
    inflight = 2
    for i in range(6):                               # not saturated, window in use: grows fast
        assert w.on_reading(Saturation(0, inflight, 0.1, float(i)), inflight)
        inflight = w.limit
    assert w.window >= 16 and w.is_driven(5.5)
    w.on_first_token(10.0, 10, 5.0, inflight, 5.5)   # driven: a slow first token does not shrink it
    assert w.window >= 16
    big = w.window
    assert not w.on_reading(Saturation(6, 12, 0.2, 6.0), 18)     # 6 of our 18 queue there
    assert w.window == 12 and w.decreases == 1
    assert not w.on_reading(Saturation(0, 12, 0.95, 7.0), 10)    # KV nearly full: down to in flight
    assert w.window == 10
    assert not w.on_reading(Saturation(0, 5, 0.1, 8.0), 5)       # window not in use: no growth
    assert w.window == 10 < big
    w.on_reading(Saturation(0, 10, 0.1, 9.0), 10, starting=7)    # 7 of ours late: a prefill backlog
    assert w.window == 10 - (7 - 4)
    assert not w.is_driven(20.0)                     # stale reading: the TTFT rule is back
    before = w.window
    w.on_first_token(0.1, 10, 19.9, 10, 20.0)
    w.on_first_token(5.0, 10, 20.0, 10, 25.0)        # queueing by latency: shrinks
    assert w.window < before
    with pytest.raises(ValueError):
        SaturationConfig(max_kv_usage=0)


def test_late_first_tokens_counts_only_requests_past_their_ttft_target():
    from types import SimpleNamespace
    w = SaturationWindow(WindowConfig(tolerance=2.0, slack_s=0.0), SaturationConfig())
    b = SimpleNamespace(window=w)
    job = lambda released, first=None: SimpleNamespace(  # noqa: E731
        released_s=released, req=SimpleNamespace(first_token_s=first, prompt_tokens=100))
    jobs = [job(9.5), job(9.2), job(9.9, first=10.0)]
    assert late_first_tokens(b, jobs, 10.0) == 0                 # no TTFT seen: 1 s allowed
    assert late_first_tokens(b, jobs + [job(8.0)], 10.0) == 1
    w.on_first_token(0.2, 100, 0.0, 1, 0.2)                      # baseline 0.2 s: target 0.4 s
    assert late_first_tokens(b, jobs, 10.0) == 2


def _gateway(h, backends, **kw):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), backends, **kw)
    return gw, ServerThread(create_app(gw, 2.0), gw, grace_s=2.0)


def test_gateway_sends_authenticated_tenant_and_class(h):
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread

    app = create_fake_backend(concurrency=2, token_delay_s=0.001)
    fake = ServerThread(app).start()
    gw, st = _gateway(h, [fake.url], backend_priority=True)
    with st:
        body = {"prompt": "x y", "max_tokens": 2, "vllm_xargs": {"tenant": "b", "class": "realtime", "seed_tag": "k"}}
        r = httpx.post(st.url + "/v1/completions", json=body, headers=h.auth("a"), timeout=30)
        assert r.status_code == 200, r.text
    fake.stop()
    sent = app.state.stats["bodies"][-1]
    rec = gw.records.items[-1]
    assert sent["vllm_xargs"]["tenant"] == "a" == rec["tenant"]          # not the claimed "b"
    assert sent["vllm_xargs"]["class"] == rec["class"] and sent["vllm_xargs"]["seed_tag"] == "k"
    spec = h.service_contract().classes[rec["class"]]
    assert sent["priority"] == -round(spec.priority)


def test_gateway_window_follows_backend_saturation(h):
    """A fake backend that runs 8 at once and says so on /metrics: with 16 concurrent clients
    the window grows to what it runs (not stuck at the TTFT rule's guess) and no further."""
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread

    fake = ServerThread(create_fake_backend(concurrency=8, token_delay_s=0.01, vllm_metrics=True)).start()
    gw, st = _gateway(h, [fake.url], saturation=SaturationConfig(poll_s=0.05))
    peak = [0.0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], gw.backends[0].inflight)
            time.sleep(0.005)

    def call():
        for _ in range(3):
            httpx.post(st.url + "/v1/completions", json={"prompt": "x", "max_tokens": 20},
                       headers=h.auth("a"), timeout=60)
    with st:
        threads = [threading.Thread(target=call) for _ in range(16)] + [threading.Thread(target=watch)]
        for t in threads:
            t.start()
        for t in threads[:-1]:
            t.join(60)
        stop.set()
        threads[-1].join(5)
        w = gw.backends[0].window
        assert isinstance(w, SaturationWindow) and w.supported and w.reading is not None
        assert peak[0] >= 8                    # grew to the backend's concurrency
        assert w.decreases >= 1                # and was cut back when requests queued there
    fake.stop()
    assert all(r["status"] == "finished" for r in gw.records.items) and len(gw.records.items) == 48


def test_prefill_backlog_bounds_releases_while_driven():
    from types import SimpleNamespace
    from tokenfair.serve.saturation import prefill_backlog
    job = lambda prompt, first=None: SimpleNamespace(req=SimpleNamespace(prompt_tokens=prompt, first_token_s=first))  # noqa: E731
    assert prefill_backlog([job(100), job(50, first=1.0), job(30)]) == 130
    w = SaturationWindow(WindowConfig(), SaturationConfig(max_prefill_tokens=250))
    assert w.admits_prompt(200, 100, 0.0)            # no reading yet: not driven, no bound
    w.on_reading(Saturation(0, 1, 0.1, 0.0), 1)
    assert w.admits_prompt(150, 100, 0.5) and not w.admits_prompt(200, 100, 0.5)
    assert w.admits_prompt(0, 5000, 0.5)             # an empty backlog takes any prompt
    assert SaturationWindow(WindowConfig(), SaturationConfig(max_prefill_tokens=None)).admits_prompt(10**6, 1, 0.0)
    with pytest.raises(ValueError):
        SaturationConfig(max_prefill_tokens=0)


@pytest.mark.parametrize("max_prefill_tokens", [250, None])
def test_prefill_backlog_keeps_a_burst_queued_in_the_gateway(h, max_prefill_tokens):
    """A backend that takes everything at once (vLLM's 128 slots) and is slow to a first
    token: with the backlog bounded the gateway holds most of a heavy burst, so a light
    request sent after it reaches the backend early; unbounded, it arrives behind the burst."""
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread

    app = create_fake_backend(concurrency=64, token_delay_s=0.01, ttft_s=0.5, vllm_metrics=True)
    fake = ServerThread(app).start()
    gw, st = _gateway(h, [fake.url], window=WindowConfig(initial=32),
                      saturation=SaturationConfig(poll_s=0.05, max_prefill_tokens=max_prefill_tokens))
    heavy_prompt = "word " * 80                      # about 100 tokens by the gateway's estimate

    def call(tenant: str, prompt: str) -> int:
        return httpx.post(st.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 3},
                          headers=h.auth(tenant), timeout=60).status_code
    with st:
        time.sleep(0.3)                              # a first /metrics reading: the window is driven
        threads = [threading.Thread(target=call, args=("heavy", heavy_prompt)) for _ in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        def num_in() -> int:                         # held or recorded (an ending job is both a moment)
            return len(set(gw.jobs) | {r["request_id"] for r in list(gw.records.items)})
        while num_in() < 8 and time.monotonic() < deadline:   # the burst is in
            time.sleep(0.01)
        assert call("light", "hi") == 200
        for t in threads:
            t.join(60)
    fake.stop()
    order = [b["vllm_xargs"]["tenant"] for b in app.state.stats["bodies"]]
    assert sorted(order) == ["heavy"] * 8 + ["light"]
    if max_prefill_tokens is None:
        assert order.index("light") >= 6             # behind (nearly: bodies race to the backend) the burst
    else:
        assert order.index("light") <= 4             # behind at most the backlog's two and their successors
    assert all(r["status"] == "finished" for r in gw.records.items)

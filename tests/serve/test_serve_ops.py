"""Operations: 503 ``shutting_down`` while the grace period runs (the listener stays open),
gauges that read 0 instead of vanishing, counters typed as counters, a 401 counter, an
optional key on /metrics, and the load generator's reasons."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tokenfair.serve.auth import hash_key


def test_new_requests_get_503_shutting_down_during_the_grace_period(tiny_model_dir, h, monkeypatch):
    svc, st = h.start_serve(tiny_model_dir, grace_s=3.0)
    execute = svc.engine.execute
    monkeypatch.setattr(svc.engine, "execute", lambda out: (time.sleep(0.01), execute(out))[1])
    first = threading.Event()
    lines: list[str] = []

    def stream_long():
        with httpx.stream("POST", st.url + "/v1/completions", headers=h.auth("a"), timeout=30,
                          json={"prompt": "the lazy dog", "max_tokens": 100, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    first.set()
    t = threading.Thread(target=stream_long, daemon=True)
    t.start()
    assert first.wait(20)
    st.server.should_exit = True               # what SIGTERM does
    assert h.wait_until(lambda: svc.closing, 5)
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("b"), timeout=10, json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down" and "retry-after" in r.headers
    client = openai.OpenAI(base_url=st.url + "/v1", api_key=h.KEYS["b"], max_retries=0, timeout=10)
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=1)
    assert err.value.status_code == 503 and err.value.code == "shutting_down"
    assert httpx.get(st.url + "/healthz", timeout=5).status_code == 503
    t.join(30)
    st.stop()
    assert lines[-1] == "[DONE]"
    assert not svc.jobs


def test_gauges_read_zero_and_counters_are_counters(serve_stack, h):
    from tokenfair.serve.metrics import ServiceMetrics

    svc, st = serve_stack
    state = {"queue": {("light", "interactive"): 2}, "running": {"light": 1}}
    m = ServiceMetrics(svc.contract, 20, lambda: dict(state))
    text = m.render().decode()
    assert 'tokenfair_queue_length{class="interactive",tenant="light"} 2.0' in text
    state.update(queue={}, running={})
    text = m.render().decode()     # gone: read 0 instead of vanishing
    assert 'tokenfair_queue_length{class="interactive",tenant="light"} 0.0' in text
    assert 'tokenfair_running_requests{tenant="light"} 0.0' in text
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("light"), timeout=30,
                   json={"prompt": "fox", "max_tokens": 2})
    assert r.status_code == 200
    text = httpx.get(st.url + "/metrics").text
    assert "# TYPE tokenfair_engine_steps_total counter" in text
    assert float(text.split("\ntokenfair_engine_steps_total ")[1].split()[0]) > 0

def test_401_counter_and_metrics_key(serve_stack, h, monkeypatch):
    svc, st = serve_stack
    r = httpx.post(st.url + "/v1/completions", headers={"Authorization": "Bearer nope"}, json={"prompt": "x"})
    assert r.status_code == 401
    text = httpx.get(st.url + "/metrics").text
    assert 'tokenfair_unauthorized_requests_total{endpoint="/v1/completions"}' in text
    monkeypatch.setattr(svc, "metrics_key_sha256", hash_key("metrics-key"))
    assert httpx.get(st.url + "/metrics").status_code == 401
    assert httpx.get(st.url + "/metrics", headers=h.auth("a")).status_code == 401
    ok = httpx.get(st.url + "/metrics", headers={"Authorization": "Bearer metrics-key"})
    assert ok.status_code == 200 and 'endpoint="/metrics"' in ok.text


def test_load_reason_names_the_code_once():
    from tokenfair.serve.load_request import reason_of

    assert reason_of("overloaded", "overloaded: tenant 'a' would wait ~3s") == "overloaded: tenant 'a' would wait ~3s"
    assert reason_of("shutdown", "request failed: shutdown: the server is stopping") == \
        "shutdown: the server is stopping"
    assert reason_of("http_502", "bad gateway") == "http_502: bad gateway"
    assert reason_of("timeout", "") == "timeout"


def test_default_grace_fits_kubernetes():
    from tokenfair.serve.defaults import CLOSE_S, DEFAULT_GRACE_S

    assert DEFAULT_GRACE_S + CLOSE_S < 30.0       # Kubernetes' default terminationGracePeriodSeconds

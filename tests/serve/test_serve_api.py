"""``serve`` mode over real HTTP on 127.0.0.1 with a tiny random model."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tokenfair.core.reasons import ReasonCode, code_of

TIMEOUT = httpx.Timeout(30.0)


def _sse_events(lines):
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _record(svc, rid):
    for rec in list(svc.records.items):
        if rec["request_id"] == rid:
            return rec
    return None


def test_completion_non_streaming_usage(serve_stack, h):
    svc, st = serve_stack
    prompt = "the quick brown fox"
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": 7, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    n_prompt = len(svc.loaded.encode(prompt))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 7, "total_tokens": n_prompt + 7}
    assert body["choices"][0]["finish_reason"] == "length"
    rec = _record(svc, r.headers["x-request-id"])
    assert rec["status"] == "finished" and rec["output_tokens"] == 7 and rec["http_status"] == 200
    assert rec["tenant"] == "a" and rec["class"] == "interactive"
    # greedy decoding is deterministic; token-id prompts give the same result
    ids = svc.loaded.encode(prompt)
    r2 = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                    json={"prompt": ids, "max_tokens": 7, "temperature": 0, "ignore_eos": True})
    assert r2.status_code == 200 and r2.json()["choices"][0]["text"] == body["choices"][0]["text"]


def test_chat_streaming_matches_non_streaming(serve_stack, h):
    svc, st = serve_stack
    req = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 9, "temperature": 0,
           "ignore_eos": True}
    full = httpx.post(st.url + "/v1/chat/completions", headers=h.auth("a"), json=req, timeout=TIMEOUT)
    assert full.status_code == 200, full.text
    fb = full.json()
    assert fb["object"] == "chat.completion" and fb["choices"][0]["message"]["role"] == "assistant"
    assert fb["usage"]["completion_tokens"] == 9
    with httpx.stream("POST", st.url + "/v1/chat/completions", headers=h.auth("a"), timeout=TIMEOUT,
                      json={**req, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == fb["choices"][0]["message"]["content"]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == fb["usage"]


def test_completion_stream_without_usage_and_stop_string(serve_stack, h):
    svc, st = serve_stack
    base = {"prompt": "a paged kv cache", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    full = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), json=base, timeout=TIMEOUT).json()
    text = full["choices"][0]["text"]
    with httpx.stream("POST", st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                      json={**base, "stream": True}) as r:
        events = _sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and not any("usage" in e for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text
    # a stop string cuts the text before it
    visible = text.strip("\ufffd")
    if len(visible) >= 4:
        stop = visible[2:4]
        cut = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                         json={**base, "stop": [stop]}).json()
        assert cut["choices"][0]["finish_reason"] == "stop"
        assert stop not in cut["choices"][0]["text"]
        assert text.startswith(cut["choices"][0]["text"])


def test_auth_401(serve_stack):
    _, st = serve_stack
    body = {"prompt": "x", "max_tokens": 1}
    r = httpx.post(st.url + "/v1/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(st.url + "/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}, timeout=TIMEOUT)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # auth is checked before the body is looked at
    r = httpx.post(st.url + "/v1/completions", content=b"{not json", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(st.url + "/v1/models").status_code == 401


def test_models_health(serve_stack, h):
    _, st = serve_stack
    r = httpx.get(st.url + "/v1/models", headers=h.auth("a"))
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["tiny"]
    hz = httpx.get(st.url + "/healthz")
    assert hz.status_code == 200 and hz.json()["status"] == "ok"


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"max_tokens": 3}).encode(), "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}).encode(), "max_tokens"),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), "messages.0.role"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), "n"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": 9}).encode(), "temperature"),
    (json.dumps({"messages": [], "max_tokens": 3}).encode(), "messages"),
])
def test_malformed_body_400(serve_stack, h, body, param):
    _, st = serve_stack
    r = httpx.post(st.url + "/v1/chat/completions", content=body,
                   headers={**h.auth("a"), "content-type": "application/json"}, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    if param:
        assert err["message"].startswith(param + ":")


def test_bad_header_and_unknown_model(serve_stack, h):
    _, st = serve_stack
    body = {"prompt": "x", "max_tokens": 1}
    r = httpx.post(st.url + "/v1/completions", json=body, headers={**h.auth("a"), "x-tokenfair-deadline-s": "soon"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-tokenfair-deadline-s"
    r = httpx.post(st.url + "/v1/completions", json={**body, "model": "gpt-9"}, headers=h.auth("a"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_prompt_or_max_tokens_beyond_context_400(serve_stack, h):
    svc, st = serve_stack
    ids = [5] * (svc.max_context + 3)
    r = httpx.post(st.url + "/v1/completions", json={"prompt": ids, "max_tokens": 4}, headers=h.auth("a"),
                   timeout=TIMEOUT)
    assert r.status_code == 400, r.text           # OpenAI's status and code for it
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert r.headers["x-should-retry"] == "false"
    recs = [x for x in svc.records.items if x["reason"].startswith("context_length_exceeded")]
    assert recs and recs[-1]["status"] == "rejected" and recs[-1]["http_status"] == 400
    # a prompt that fits but whose max_tokens would not is refused, naming max_tokens
    n = svc.max_context - 3
    r = httpx.post(st.url + "/v1/completions", json={"prompt": [5] * n, "max_tokens": 50}, headers=h.auth("a"),
                   timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert f"you requested {n + 50} tokens ({n} in the prompt, 50 in the completion)" in r.json()["error"]["message"]
    # without max_tokens the default is clamped to what is left
    ok = httpx.post(st.url + "/v1/completions", json={"prompt": [5] * n, "max_tokens": None, "ignore_eos": True},
                    headers=h.auth("a"), timeout=TIMEOUT)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3

def test_class_clamping_and_403(serve_stack, h):
    svc, st = serve_stack
    body = {"prompt": "fair scheduling", "max_tokens": 2}
    r = httpx.post(st.url + "/v1/completions", json=body, headers={**h.auth("b"), "x-tokenfair-class": "realtime"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "class_not_allowed"
    # status, body code, record and metric label all come from the request's one ReasonCode
    rec = [x for x in list(svc.records.items) if x["tenant"] == "b" and x["class"] == "realtime"][-1]
    assert code_of(rec["reason"]) is ReasonCode.CLASS_NOT_ALLOWED and rec["http_status"] == 403
    assert r.json()["error"]["message"] == rec["reason"] == "class_not_allowed: tenant 'b' may not use class 'realtime'"
    assert 'tokenfair_rejections_total{reason="class_not_allowed",tenant="b"}' in svc.metrics.render().decode()
    # a tenant's default class comes from the contract
    r = httpx.post(st.url + "/v1/completions", json=body, headers=h.auth("b"), timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["x-tokenfair-class"] == "batch"
    # a request may ask for a LATER deadline than its class gives, never an earlier one
    r = httpx.post(st.url + "/v1/completions", timeout=TIMEOUT, json={**body, "tokenfair": {"class": "timed"}},
                   headers={**h.auth("b"), "x-tokenfair-deadline-s": "0.5"})
    assert r.status_code == 200
    rec = _record(svc, r.headers["x-request-id"])
    assert rec["class"] == "timed" and rec["deadline_s"] - rec["arrival_s"] == pytest.approx(60.0)
    r = httpx.post(st.url + "/v1/completions", timeout=TIMEOUT, json=body,
                   headers={**h.auth("b"), "x-tokenfair-class": "timed", "x-tokenfair-deadline-s": "90"})
    rec = _record(svc, r.headers["x-request-id"])
    assert rec["deadline_s"] - rec["arrival_s"] == pytest.approx(90.0)


@pytest.fixture
def slow_engine(serve_stack, monkeypatch):
    """Each engine step takes >= 4 ms more, so long requests surely outlive the checks."""
    import time as _time
    svc, _ = serve_stack
    execute = svc.engine.execute

    def slow(out):
        _time.sleep(0.004)
        return execute(out)
    monkeypatch.setattr(svc.engine, "execute", slow)
    yield
    # let nothing started under the slow engine outlive the test
    assert _wait_idle(svc)


def _wait_idle(svc, timeout_s=30.0):
    import time as _time
    end = _time.monotonic() + timeout_s
    while _time.monotonic() < end:
        if not svc.jobs:
            return True
        _time.sleep(0.01)
    return False


class _Holder:
    """A streaming request kept open in a thread until released."""

    def __init__(self, url, headers, body):
        self.first = threading.Event()
        self.events = []
        self.status = None
        self.thread = threading.Thread(target=self._run, args=(url, headers, body), daemon=True)
        self.thread.start()

    def _run(self, url, headers, body):
        with httpx.stream("POST", url, headers=headers, json={**body, "stream": True}, timeout=TIMEOUT) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.first.set()
        self.first.set()


def test_queue_full_429_and_deadline_expiry_504(serve_stack, h, slow_engine):
    svc, st = serve_stack
    url = st.url + "/v1/completions"
    long = {"prompt": "the lazy dog", "max_tokens": 230, "ignore_eos": True, "temperature": 0}
    hold = _Holder(url, h.auth("q"), long)        # q: max_concurrency 1, max_queued 1
    assert hold.first.wait(20)
    # q's only slot is busy: a request with a tiny deadline cannot start in time -> expired
    r = httpx.post(url, json={"prompt": "x", "max_tokens": 2}, timeout=TIMEOUT,
                   headers={**h.auth("q"), "x-tokenfair-deadline-s": "0.05"})
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "deadline_infeasible"
    assert _record(svc, r.headers["x-request-id"])["status"] == "expired"
    queued = _Holder(url, h.auth("q"), {"prompt": "x", "max_tokens": 2})
    assert h.wait_until(lambda: svc.policy.tenants["q"].num_waiting == 1)
    r = httpx.post(url, json={"prompt": "x", "max_tokens": 2}, headers=h.auth("q"), timeout=TIMEOUT)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-limit-requests"] == "1"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    hold.thread.join(30)
    queued.thread.join(30)
    assert hold.status == 200 and queued.status == 200 and hold.events[-1] == "[DONE]"
    assert not hold.thread.is_alive() and not queued.thread.is_alive()


def test_rate_limited_429_token_headers(serve_stack, h):
    _, st = serve_stack
    url = st.url + "/v1/completions"
    body = {"prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 8}
    first = httpx.post(url, json=body, headers=h.auth("r"), timeout=TIMEOUT)   # spends the burst
    assert first.status_code == 200
    r = httpx.post(url, json=body, headers=h.auth("r"), timeout=TIMEOUT)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limited"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-limit-tokens"] == "10"
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 0
    assert float(r.headers["x-ratelimit-reset-tokens"].rstrip("s")) > 0
    for k in ("limit", "remaining", "reset"):
        assert f"x-ratelimit-{k}-requests" in r.headers


def test_disconnect_frees_kv_and_slot(serve_stack, h, slow_engine):
    svc, st = serve_stack
    pool, cache = svc.sched.pool, svc.engine.runner.cache
    assert h.wait_until(lambda: not svc.sched.running and pool.num_free == pool.num_blocks)
    body = {"prompt": "the quick brown fox jumps over the lazy dog " * 3, "max_tokens": 150, "ignore_eos": True,
            "stream": True, "temperature": 0}
    with httpx.stream("POST", st.url + "/v1/completions", json=body, headers=h.auth("a"), timeout=TIMEOUT) as r:
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
                if got == 2:
                    break
        assert pool.num_free < pool.num_blocks          # it holds KV while streaming
    # the client is gone: the request ends FAILED with a reason, its KV and slot are freed at once
    assert h.wait_until(lambda: _record(svc, rid) is not None, 10)
    rec = _record(svc, rid)
    assert rec["status"] == "failed" and rec["reason"].startswith("client_disconnected")
    assert 0 < rec["output_tokens"] < 150
    assert h.wait_until(lambda: pool.num_free == pool.num_blocks and cache.num_free_blocks == cache.num_blocks, 5)
    assert not svc.sched.running and svc.policy.num_waiting() == 0


def test_disconnect_while_queued_frees_queue_slot(serve_stack, h, slow_engine):
    svc, st = serve_stack
    url = st.url + "/v1/completions"
    hold = _Holder(url, h.auth("q"), {"prompt": "the lazy dog", "max_tokens": 230, "ignore_eos": True})
    assert hold.first.wait(20)
    before = sum(1 for r in svc.records.items if r["reason"].startswith("client_disconnected"))
    # queued behind q's only slot; the client gives up before any token
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json={"prompt": "x", "max_tokens": 2}, headers=h.auth("q"),
                   timeout=httpx.Timeout(10.0, read=0.3))
    assert h.wait_until(lambda: sum(1 for r in svc.records.items
                                    if r["reason"].startswith("client_disconnected")) == before + 1, 5)
    rec = [r for r in svc.records.items if r["reason"].startswith("client_disconnected")][-1]
    assert rec["tenant"] == "q" and rec["status"] == "failed" and rec["scheduled_s"] is None
    assert svc.policy.tenants["q"].num_waiting == 0
    hold.thread.join(30)
    assert hold.status == 200


def test_metrics_series(serve_stack, h):
    svc, st = serve_stack
    httpx.post(st.url + "/v1/completions", json={"prompt": "x y", "max_tokens": 3}, headers=h.auth("a"),
               timeout=TIMEOUT)
    text = httpx.get(st.url + "/metrics").text
    for series in ("tokenfair_requests_total{", "tokenfair_ttft_seconds_bucket{", "tokenfair_tpot_seconds_bucket{",
                   "tokenfair_queue_wait_seconds_count{", "tokenfair_tokens_total{", "tokenfair_rejections_total{",
                   "tokenfair_e2e_seconds_count{", "tokenfair_kv_usage_ratio", "tokenfair_kv_free_blocks",
                   "# TYPE tokenfair_queue_length gauge", "# TYPE tokenfair_service_share gauge",
                   "# TYPE tokenfair_entitled_share gauge", "# TYPE tokenfair_preemptions_total counter"):
        assert series in text, series
    assert 'tenant="a"' in text and 'kind="output"' in text


def test_every_request_one_terminal_record(serve_stack):
    svc, _ = serve_stack
    recs = list(svc.records.items)
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids))
    assert all(r["status"] in ("finished", "rejected", "expired", "failed") and r["reason"] for r in recs)
    assert not svc.jobs

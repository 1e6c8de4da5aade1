"""``serve``: one request's fault stays with that request (engine faults, bad parameters),
and the long-lived engine keeps no per-step history."""

from __future__ import annotations

import httpx
import pytest

TIMEOUT = httpx.Timeout(30.0)


def test_serve_engine_keeps_no_step_log(serve_stack, h):
    svc, st = serve_stack
    steps0 = svc.engine.num_steps
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"prompt": "the quick brown fox", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert svc.engine.num_steps >= steps0 + 5
    assert svc.engine.keep_step_log is False and svc.engine.step_log == []


POISON = [11, 12, 13, 14, 15]


def _client(st, tenant, h, **kw):
    import openai

    return openai.OpenAI(base_url=st.url + "/v1", api_key=h.KEYS[tenant], timeout=30.0, **kw)


def _poison_runner(svc, monkeypatch):
    """The runner raises on any step holding the prefill of a prompt starting with POISON."""
    runner = svc.engine.runner
    step = runner.step

    def poisoned(batch):
        if any(w.start_pos == 0 and w.token_ids[:len(POISON)] == POISON for w in batch):
            raise ValueError("Overflow when unpacking long long")
        return step(batch)
    monkeypatch.setattr(runner, "step", poisoned)


def test_poisoned_request_fails_alone_among_other_tenants_streams(serve_stack, h, monkeypatch):
    import openai

    svc, st = serve_stack
    _poison_runner(svc, monkeypatch)
    results: dict[str, object] = {}

    def stream(i):
        tenant = ("b", "heavy", "light")[i % 3]
        chunks = _client(st, tenant, h).completions.create(model="tiny", prompt=f"fair scheduling {i}", max_tokens=12,
                                                           stream=True, extra_body={"ignore_eos": True})
        results[f"s{i}"] = sum(1 for c in chunks if c.choices and c.choices[0].text is not None)

    import threading
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(9)]
    for t in threads:
        t.start()
    before = len(svc.records.items)
    with pytest.raises(openai.InternalServerError) as err:   # max_retries=2: x-should-retry stops them
        _client(st, "a", h, max_retries=2).completions.create(model="tiny", prompt=POISON, max_tokens=4)
    for t in threads:
        t.join(60)
    assert err.value.status_code == 500 and err.value.response.headers["x-should-retry"] == "false"
    assert err.value.body["code"] == "request_fault"
    assert len(results) == 9 and all(n >= 1 for n in results.values()), results
    recs = list(svc.records.items)[before:]
    poisoned = [r for r in recs if r["tenant"] == "a"]
    assert len(poisoned) == 1 and poisoned[0]["status"] == "failed"        # sent once, not retried
    assert poisoned[0]["reason"] == "request_fault: ValueError: Overflow when unpacking long long"
    others = [r for r in recs if r["tenant"] != "a"]
    assert len(others) == 9 and all(r["status"] == "finished" and r["output_tokens"] == 12 for r in others)


@pytest.mark.parametrize("body,param", [
    ({"seed": 18446744073709551617, "temperature": 1.0}, "seed"),
    ({"seed": -(2 ** 63) - 1}, "seed"),
    ({"stream": "yes"}, "stream"),
    ({"max_tokens": "2"}, "max_tokens"),
    ({"prompt": [True]}, "prompt"),
    ({"logprobs": 2}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
])
def test_bad_or_unsupported_parameters_are_400_naming_them(serve_stack, h, body, param):
    svc, st = serve_stack
    n = len(svc.records.items)
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"prompt": "hi", "max_tokens": 3, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.headers["x-should-retry"] == "false"
    assert len(svc.records.items) == n      # refused before admission: no request was made


def test_neutral_values_of_unsupported_parameters_are_accepted(serve_stack, h):
    _, st = serve_stack
    r = _client(st, "a", h).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, seed=2 ** 64 - 1, temperature=1.0,
        logprobs=False, presence_penalty=0, frequency_penalty=0.0, response_format={"type": "text"})
    assert r.choices[0].finish_reason in ("length", "stop")


def test_body_over_the_cap_is_413_before_parsing(serve_stack, h, monkeypatch):
    svc, st = serve_stack
    monkeypatch.setattr(svc, "max_body_bytes", 1000)
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"prompt": "x" * 2000, "max_tokens": 2})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    ok = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                    json={"prompt": "x" * 100, "max_tokens": 2})
    assert ok.status_code == 200


def test_huge_prompt_is_refused_without_tokenizing(serve_stack, h, monkeypatch):
    svc, st = serve_stack
    calls = []
    encode = svc.loaded.encode
    monkeypatch.setattr(svc.loaded, "encode", lambda text, *a, **k: calls.append(len(text)) or encode(text, *a, **k))
    r = httpx.post(st.url + "/v1/chat/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"messages": [{"role": "user", "content": "fox " * 200_000}], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "messages" and calls == []


def test_a_bad_seed_among_other_tenants_streams_is_a_400_with_its_param_for_the_openai_client(serve_stack, h):
    import threading

    import openai

    svc, st = serve_stack
    done: dict[int, int] = {}

    def stream(i):
        chunks = _client(st, ("b", "heavy", "light")[i % 3], h).completions.create(
            model="tiny", prompt=f"fair scheduling {i}", max_tokens=10, stream=True, extra_body={"ignore_eos": True},
            stream_options={"include_usage": True})
        done[i] = [c.usage.completion_tokens for c in chunks if c.usage is not None][0]

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    with pytest.raises(openai.BadRequestError) as err:
        _client(st, "a", h).completions.create(model="tiny", prompt="hi", max_tokens=3, seed=2 ** 64 + 1,
                                               temperature=1.0)
    for t in threads:
        t.join(60)
    assert err.value.status_code == 400 and err.value.param == "seed" and err.value.code == "invalid_request"
    assert done == {i: 10 for i in range(6)}


def test_a_429_retry_after_is_honoured_by_the_openai_client(serve_stack, h, monkeypatch):
    svc, st = serve_stack
    h.assert_retry_after_honoured(svc, st.url, h.KEYS["a"], monkeypatch)


@pytest.mark.parametrize("stream", [True, False])
def test_a_stop_string_fault_fails_its_request_alone_with_a_reason(serve_stack, h, monkeypatch, stream):
    import threading

    from tokenfair.serve.engine_job import ServeJob

    svc, st = serve_stack
    text = ServeJob._text

    def broken(self, delta, final):
        if "BOOM" in self.stops and self.detok is not None and len(self.detok.ids) >= 3:
            raise IndexError("stop-string matcher bug")
        return text(self, delta, final)
    monkeypatch.setattr(ServeJob, "_text", broken)
    other: dict = {}
    t = threading.Thread(target=lambda: other.update(r=httpx.post(
        st.url + "/v1/completions", headers=h.auth("b"), timeout=TIMEOUT,
        json={"prompt": "the lazy dog", "max_tokens": 12, "ignore_eos": True, "stop": ["zzz"]})))
    t.start()
    body = {"prompt": "the quick brown fox", "max_tokens": 20, "ignore_eos": True, "stop": ["BOOM"], "stream": stream}
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT, json=body)
    t.join(60)
    if stream:
        assert r.status_code == 200 and '"code": "request_fault"' in r.text.replace('":"', '": "')
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.status_code == 500 and r.json()["error"]["code"] == "request_fault"
    rid = r.headers["x-request-id"]
    assert h.wait_until(lambda: any(x["request_id"] == rid for x in svc.records.items), 10)
    rec = [x for x in svc.records.items if x["request_id"] == rid][0]
    assert rec["status"] == "failed" and rec["reason"] == "request_fault: IndexError: stop-string matcher bug"
    assert other["r"].status_code == 200 and other["r"].json()["usage"]["completion_tokens"] == 12


def test_a_tokenizer_error_is_a_400_for_that_request_only(serve_stack, h, monkeypatch):
    svc, st = serve_stack
    encode = svc.loaded.encode

    def fragile(text, *a, **k):
        if "TOKFAIL" in text:
            raise RuntimeError("tokenizer exploded")
        return encode(text, *a, **k)
    monkeypatch.setattr(svc.loaded, "encode", fragile)
    r = httpx.post(st.url + "/v1/chat/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"messages": [{"role": "user", "content": "TOKFAIL"}], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "tokenizer cannot encode it: RuntimeError: tokenizer exploded" in r.json()["error"]["message"]
    ok = httpx.post(st.url + "/v1/chat/completions", headers=h.auth("a"), timeout=TIMEOUT,
                    json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2})
    assert ok.status_code == 200

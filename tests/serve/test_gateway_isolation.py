"""The gateway passes a backend's verdict on a request through: a fault a retry cannot fix is
not retried on another backend, the backend's code and param are kept, and the client never
sees a backend's address."""

from __future__ import annotations

import httpx
import pytest

POISON = [11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def gw_stack(tiny_model_dir, h):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    backends = [h.start_serve(tiny_model_dir) for _ in range(2)]
    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), [t.url for _, t in backends])
    gt = ServerThread(create_app(gw), gw).start()
    yield backends, gw, gt
    gt.stop()
    for _, t in backends:
        t.stop()


def test_request_fault_is_not_retried_on_other_backends(gw_stack, h, monkeypatch):
    backends, gw, gt = gw_stack
    for svc, _ in backends:
        step = svc.engine.runner.step

        def poisoned(batch, step=step):
            if any(w.start_pos == 0 and w.token_ids[:len(POISON)] == POISON for w in batch):
                raise ValueError("Overflow when unpacking long long")
            return step(batch)
        monkeypatch.setattr(svc.engine.runner, "step", poisoned)
    before = [len(svc.records.items) for svc, _ in backends]
    r = httpx.post(gt.url + "/v1/completions", headers=h.auth("a"), timeout=30, json={"prompt": POISON, "max_tokens": 3})
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false", r.text
    assert r.json()["error"]["code"] == "request_fault"
    tried = sum(len(svc.records.items) - b for (svc, _), b in zip(backends, before))
    assert tried == 1                                  # one backend saw it, once
    for _, t in backends:
        assert t.url.split("://", 1)[1] not in r.text
    rec = [x for x in gw.records.items if x["request_id"] == r.headers["x-request-id"]][0]
    assert rec["status"] == "failed" and rec["reason"].startswith("request_fault:")


def test_backend_error_code_and_param_pass_through(gw_stack, h):
    _, _, gt = gw_stack
    r = httpx.post(gt.url + "/v1/completions", headers=h.auth("a"), timeout=30,
                   json={"prompt": [5] * 200, "max_tokens": 100})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert r.headers["x-should-retry"] == "false"
    r = httpx.post(gt.url + "/v1/completions", headers=h.auth("a"), timeout=30,
                   json={"prompt": "hi", "seed": 2 ** 70, "temperature": 1.0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"


def _openai(url, h, tenant="a", **kw):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=h.KEYS[tenant], timeout=30.0, **kw)


def test_context_length_exceeded_reaches_the_openai_client_through_the_gateway_once(gw_stack, h):
    import openai

    backends, _, gt = gw_stack
    before = [len(svc.records.items) for svc, _ in backends]
    with pytest.raises(openai.BadRequestError) as err:
        _openai(gt.url, h, max_retries=2).completions.create(model="tiny", prompt=[5] * 200, max_tokens=100)
    assert err.value.code == "context_length_exceeded" and err.value.param == "max_tokens"
    assert sum(len(svc.records.items) - b for (svc, _), b in zip(backends, before)) == 1


def test_the_gateways_max_context_refuses_what_cannot_fit_and_lets_the_backend_judge_estimates(gw_stack, h):
    import openai

    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    backends, _, _ = gw_stack
    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), [t.url for _, t in backends], max_context=256)
    with ServerThread(create_app(gw), gw) as gt:
        client = _openai(gt.url, h)
        before = [len(svc.records.items) for svc, _ in backends]
        for kw, param in [({"prompt": "hi", "max_tokens": 256}, "max_tokens"),
                          ({"prompt": [5] * 200, "max_tokens": 57}, "max_tokens"),
                          ({"prompt": "x" * 2000, "max_tokens": 2}, "prompt")]:
            with pytest.raises(openai.BadRequestError) as err:
                client.completions.create(model="tiny", **kw)
            assert err.value.code == "context_length_exceeded" and err.value.param == param, kw
        assert [len(svc.records.items) for svc, _ in backends] == before       # refused at the gateway
        ok = client.completions.create(model="tiny", prompt=[5] * 200, max_tokens=56)   # fits exactly: not clamped
        assert ok.usage.completion_tokens >= 1 and ok.usage.prompt_tokens == 200
        # 180 tokens by the estimate (720 characters / 4) + 100 > 256, but 60 tokens in fact:
        # not refused on the estimate, the backend serves all 100
        fits = client.completions.create(model="tiny", prompt="<|im_start|>" * 60, max_tokens=100,
                                         extra_body={"ignore_eos": True})
        assert (fits.usage.prompt_tokens, fits.usage.completion_tokens) == (60, 100)
        assert sum(len(svc.records.items) - b for (svc, _), b in zip(backends, before)) == 2


def test_a_gateway_429_retry_after_is_honoured_by_the_openai_client(gw_stack, h, monkeypatch):
    _, gw, gt = gw_stack
    h.assert_retry_after_honoured(gw, gt.url, h.KEYS["a"], monkeypatch)

def test_a_wrong_key_is_an_authentication_error_for_the_openai_client_at_serve_and_gateway(gw_stack, h):
    import openai

    backends, _, gt = gw_stack
    for url in (gt.url, backends[0][1].url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="not-a-key", max_retries=0, timeout=10.0)
        with pytest.raises(openai.AuthenticationError) as err:
            client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client.models.list()

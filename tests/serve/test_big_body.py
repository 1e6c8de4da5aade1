"""Big bodies are parsed and bounded in a helper process (serve/body_precheck.py): the server
itself never parses the prompt of a body refused by its length."""

from __future__ import annotations

import json

import httpx
import pytest

from tokenfair.serve.body_precheck import PROCESS_PARSE_BYTES, check_body

TIMEOUT = httpx.Timeout(60.0)


@pytest.mark.parametrize("kind,body,bound", [
    ("chat", {"messages": [{"role": "user", "content": ""}] * 300, "max_tokens": 2}, 300),
    ("chat", {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 2}, 1000),
    ("completion", {"prompt": [5] * 257, "max_tokens": 2}, 257),
    ("completion", {"prompt": "y" * 1200, "max_tokens": 2}, 300),
])
def test_the_helper_bounds_the_prompt_and_cuts_it_out_when_it_cannot_fit(kind, body, bound):
    v = check_body(json.dumps({**body, "user": "u1"}).encode(), kind, max_context=256, max_token_chars=4)
    assert v.error is None and v.min_prompt_tokens == bound
    assert v.reduced is not None and v.reduced["user"] == "u1" and v.reduced["max_tokens"] == 2
    assert v.reduced.get("prompt") == "" or v.reduced["messages"] == [{"role": "user", "content": ""}]


def test_the_helper_lets_a_fitting_prompt_through_and_names_a_bad_field():
    v = check_body(b'{"prompt": "abcd", "max_tokens": 2}', "completion", 256, 4)
    assert v.error is None and v.reduced is None and v.min_prompt_tokens == 1
    bad = check_body(b'{"prompt": "abcd", "max_tokens": "2"}', "completion", 256, 4)
    assert bad.error[0] == 400 and bad.error[3] == "max_tokens"
    assert check_body(b'{"prompt": ', "completion", 256, 4).error[2] == "invalid_json"


def test_a_big_chat_body_is_refused_by_its_length_in_the_helper_and_recorded(serve_stack, h, monkeypatch):
    import tokenfair.serve.app as app_module

    svc, st = serve_stack
    seen: list[int] = []
    parse = app_module.parse_body
    monkeypatch.setattr(app_module, "parse_body", lambda raw, cls: seen.append(len(raw)) or parse(raw, cls))
    msgs = [{"role": "user", "content": "hi"}] * 40_000
    checked, n = svc.prechecker.num_checked, len(svc.records.items)
    r = httpx.post(st.url + "/v1/chat/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   content=json.dumps({"messages": msgs, "max_tokens": 2, "user": "big"}))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert svc.prechecker.num_checked == checked + 1
    assert seen and max(seen) < 1000            # the server parsed only the body without its messages
    recs = list(svc.records.items)[n:]
    assert len(recs) == 1 and recs[0]["status"] == "rejected" and recs[0]["prompt_tokens"] >= 40_000


def test_a_big_malformed_body_is_a_400_naming_the_field(serve_stack, h):
    svc, st = serve_stack
    body = json.dumps({"prompt": "z" * (PROCESS_PARSE_BYTES + 10), "max_tokens": "2"})
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT, content=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_the_helper_without_a_tokenizer_uses_only_certain_bounds():
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}] * 2, "max_tokens": 2}).encode()
    assert check_body(body, "chat", 256, None).min_prompt_tokens == 2
    many = json.dumps({"messages": [{"role": "user", "content": "x"}] * 300, "max_tokens": 2}).encode()
    v = check_body(many, "chat", 256, None)
    assert v.min_prompt_tokens == 300 and v.reduced is not None
    assert check_body(many, "chat", None, None) == check_body(b'{"prompt": "a"}', "completion", None, None)


def test_the_gateway_refuses_a_big_body_of_more_messages_than_its_context_and_records_it(h, monkeypatch):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    with ServerThread(create_fake_backend()) as be:
        contract = h.service_contract()
        gw = Gateway(contract, KeyRing(contract), [be.url], max_context=256)
        with ServerThread(create_app(gw), gw) as gt:
            r = httpx.post(gt.url + "/v1/chat/completions", headers=h.auth("a"), timeout=TIMEOUT,
                           content=json.dumps({"messages": [{"role": "user", "content": "hi"}] * 30_000,
                                               "max_tokens": 2}))
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            assert gw.prechecker.num_checked == 1 and r.json()["error"]["param"] == "messages"
            recs = list(gw.records.items)
            assert len(recs) == 1 and recs[0]["status"] == "rejected" and recs[0]["prompt_tokens"] >= 30_000


def test_a_dead_or_failing_helper_leaves_the_body_to_the_server():
    import asyncio

    from tokenfair.serve import body_precheck

    checker = body_precheck.BodyPrechecker()

    async def run(raw):
        return await checker.check(raw, "completion", 256, 4)
    try:
        assert asyncio.run(run(b'{"prompt": "abcd", "max_tokens": 2}')).min_prompt_tokens == 1
        assert checker.num_checked == 1
        checker.pool.submit(__import__("os")._exit, 1)      # the helper process dies
        assert asyncio.run(run(b'{"prompt": "abcd", "max_tokens": 2}')) is None and checker.pool is None
        assert asyncio.run(run(b'{"prompt": "abcd", "max_tokens": 2}')).min_prompt_tokens == 1   # a new one
    finally:
        checker.close()


def test_a_tenant_with_two_big_bodies_at_the_helper_gets_a_429_others_do_not():
    import asyncio

    from tokenfair.serve import body_precheck
    from tokenfair.serve.errors import ServiceError

    checker = body_precheck.BodyPrechecker()
    checker.in_flight["a"] = body_precheck.MAX_BIG_BODIES_PER_TENANT

    async def run(tenant):
        return await checker.check(b'{"prompt": "abcd", "max_tokens": 2}', "completion", 256, 4, tenant=tenant)
    try:
        with pytest.raises(ServiceError) as err:
            asyncio.run(run("a"))
        assert err.value.status == 429 and err.value.code == "too_many_big_bodies"
        assert err.value.headers["retry-after"] == "1"
        assert asyncio.run(run("b")).min_prompt_tokens == 1 and "b" not in checker.in_flight
        assert checker.in_flight == {"a": 2}
    finally:
        checker.close()

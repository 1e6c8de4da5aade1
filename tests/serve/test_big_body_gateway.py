"""A big body through the gateway is parsed only in the helper process: the gateway's own
process parses the small rest of the body and forwards the prompt as the bytes the helper
wrote (serve/kept_prompt.py), with the identity rewrite applied to that rest."""

from __future__ import annotations

import json
import os

import httpx

from tokenfair.serve.body_precheck import PROCESS_PARSE_BYTES, check_body
from tokenfair.serve.gateway_context import estimate_tokens
from tokenfair.serve.kept_prompt import STAND_IN, body_bytes
from tokenfair.serve.openai_schema import ChatCompletionRequest

TIMEOUT = httpx.Timeout(60.0)


def test_the_helper_keeps_the_prompt_as_bytes_and_splicing_restores_the_body():
    msgs = [{"role": "user", "content": "fair share é " * (i % 7)} for i in range(50)]
    raw = {"messages": msgs, "max_tokens": 3, "vllm_xargs": {"keep": 1}, "user": "u"}
    v = check_body(json.dumps(raw).encode(), "chat", None, None, chars_per_token=4.0)
    assert v.error is None and v.pid == os.getpid() and v.min_prompt_tokens == 50
    assert v.reduced == {**raw, "messages": STAND_IN["messages"]}
    assert json.loads(v.kept.json_bytes) == msgs and v.kept.field == "messages"
    assert v.kept.est_tokens == estimate_tokens("chat", ChatCompletionRequest.model_validate(raw), 4.0)
    out = json.loads(body_bytes({**v.reduced, "stream": True}, v.kept))
    assert out == {**raw, "stream": True}
    ids = check_body(b'{"prompt": [1, 2, 3]}', "completion", 256, None, chars_per_token=4.0)
    assert json.loads(body_bytes(ids.reduced, ids.kept)) == {"prompt": [1, 2, 3]} and ids.kept.est_tokens == 3
    assert json.loads(body_bytes({}, ids.kept)) == {"prompt": [1, 2, 3]}
    bad = check_body(b'{"prompt": "x", "max_tokens": "2"}', "completion", None, None, chars_per_token=4.0)
    assert bad.error[3] == "max_tokens" and bad.kept is None


def test_a_big_body_through_the_gateway_is_parsed_in_the_helper_and_forwarded_with_the_identity(h, monkeypatch):
    import tokenfair.serve.app as app_module
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    parsed: list[int] = []
    parse = app_module.parse_body
    monkeypatch.setattr(app_module, "parse_body", lambda raw, cls: parsed.append(len(raw)) or parse(raw, cls))
    msgs = [{"role": "user", "content": f"message {i} of a long chat"} for i in range(12_000)]
    body = {"messages": msgs, "max_tokens": 2, "priority": -100,
            "vllm_xargs": {"tenant": "someone-else", "class": "realtime", "keep": 1}}
    assert len(json.dumps(body)) > PROCESS_PARSE_BYTES
    backend = create_fake_backend()
    with ServerThread(backend) as be:
        contract = h.service_contract()
        gw = Gateway(contract, KeyRing(contract), [be.url])       # no --max-context
        with ServerThread(app_module.create_app(gw), gw) as gt:
            r = httpx.post(gt.url + "/v1/chat/completions", headers=h.auth("b"), timeout=TIMEOUT,
                           content=json.dumps(body))
            assert r.status_code == 200, r.text
            assert gw.prechecker.num_checked == 1
            assert gw.prechecker.last_pid not in (None, os.getpid())      # judged in the helper process
            assert parsed and max(parsed) < 1000        # the gateway parsed only the body without its messages
            sent = backend.state.stats["bodies"][-1]
            assert sent["messages"] == msgs and sent["max_tokens"] == 2 and sent["stream"] is True
            assert sent["vllm_xargs"] == {"tenant": "b", "class": "batch", "keep": 1} and "priority" not in sent
            rec = list(gw.records.items)[-1]
            assert rec["status"] == "finished" and rec["prompt_tokens"] == 12_000 * 6   # the backend's usage (6 words each)

            def invalid(prompt):
                return httpx.post(gt.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                                  content=json.dumps({"prompt": prompt, "max_tokens": "2"}))
            small, big = invalid("x"), invalid("y" * (PROCESS_PARSE_BYTES + 10))
            assert small.status_code == big.status_code == 400 and small.json() == big.json()
            assert gw.prechecker.num_checked == 2

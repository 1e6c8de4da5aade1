"""Last in this folder: kill the stock vLLM mid-stream behind the gateway; the request
fails with a reason (the stream ends with an error event), the next one is refused with a
reason (the backend is down), the gateway's records say why."""

from __future__ import annotations

import json
import threading

import httpx
import pytest


def test_killed_backend_fails_requests_with_reason(vllm_servers, vh):
    stock = vllm_servers["stock"]
    if stock.kill is None:
        pytest.skip("TOKENFAIR_VLLM_REUSE: servers not started here are not killed")
    gw, st = vh.start_gateway(stock.url, max_retries=0)    # no other backend to retry on
    first = threading.Event()
    events: list[dict] = []
    with st:
        def call() -> None:
            with httpx.stream("POST", st.url + "/v1/completions", timeout=120,
                              headers=vh.auth("heavy_a"),
                              json={"prompt": "Tell a very long story.", "max_tokens": 1500, "ignore_eos": True,
                                    "stream": True}) as s:
                for line in s.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
                        first.set()
        t = threading.Thread(target=call)
        t.start()
        assert first.wait(120)
        stock.kill()
        t.join(120)
        assert not t.is_alive()
        after = httpx.post(st.url + "/v1/completions", timeout=60, headers=vh.auth("light"),
                           json={"prompt": "x", "max_tokens": 2})
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1 and errors[0]["message"], events[-3:]
    rec = gw.records.items[0]
    assert rec["status"] == "failed" and rec["reason"].startswith(("backend_error", "backend_unavailable")), rec
    assert after.status_code in (502, 503) and after.json()["error"]["message"]
    assert all(r["reason"] for r in gw.records.items)

"""The gateway in front of real vLLM: streamed and not, usage, the tenant vLLM is told, and
the saturation-driven window reading vLLM's own /metrics."""

from __future__ import annotations

import json

import httpx
from concurrency import call_at_once

PROMPT = "Write one sentence about the sea."


def _direct(url: str, max_tokens: int = 12) -> dict:
    r = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": "smollm2", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "vllm_xargs": {"tenant": "light"}})
    assert r.status_code == 200, r.text
    return r.json()


def test_gateway_streamed_and_not_match_direct_with_usage(vllm_servers, vh):
    stock = vllm_servers["stock"]
    direct = _direct(stock.url)
    gw, st = vh.start_gateway(stock.url)
    with st:
        r = httpx.post(st.url + "/v1/completions", headers=vh.auth("light"), timeout=120,
                       json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == direct["choices"][0]["text"]
        assert body["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        assert body["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 12
        text, usage = "", None
        with httpx.stream("POST", st.url + "/v1/completions", headers=vh.auth("light"), timeout=120,
                          json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True, "stream": True,
                                "stream_options": {"include_usage": True}}) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    for c in chunk.get("choices") or []:
                        text += c.get("text") or ""
                    usage = chunk.get("usage") or usage
        assert text == direct["choices"][0]["text"]
        assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    recs = gw.records.items
    assert [r["status"] for r in recs] == ["finished", "finished"]
    assert all(r["tenant"] == "light" and r["output_tokens"] == 12 for r in recs)


def test_gateway_tells_vllm_the_authenticated_tenant(vllm_servers, vh):
    plugin, records = vllm_servers["plugin"], vllm_servers["records"]
    before = len(vh.read_records(records))
    gw, st = vh.start_gateway(plugin.url)
    with st:
        r = httpx.post(st.url + "/v1/completions", headers=vh.auth("light"), timeout=120, json={
            "prompt": PROMPT, "max_tokens": 4, "tokenfair": {"class": "interactive"},
            "vllm_xargs": {"tenant": "heavy_a", "class": "batch"}})     # a claim the gateway replaces
        assert r.status_code == 200, r.text
    new = vh.read_records(records)[before:]
    assert [(x["tenant"], x["class"], x["status"]) for x in new] == [("light", "interactive", "finished")]
    assert gw.records.items[-1]["tenant"] == "light"


def test_gateway_window_reads_vllm_saturation(vllm_servers, vh):
    """16 concurrent streams through the gateway to a vLLM that runs 6 at once: the window is
    driven by vLLM's /metrics (no TTFT guess), all requests finish."""
    from tokenfair.serve.saturation import SaturationWindow

    stock = vllm_servers["stock"]
    gw, st = vh.start_gateway(stock.url)
    with st:
        def call(i: int) -> int:
            return httpx.post(st.url + "/v1/completions", headers=vh.auth("heavy_a"), timeout=300,
                              json={"prompt": f"{i}: {PROMPT}", "max_tokens": 8, "ignore_eos": True}).status_code
        codes = call_at_once(call, 16, 300)
        w = gw.backends[0].window
        assert isinstance(w, SaturationWindow) and w.supported and w.reading is not None
        assert w.increases >= 1
    assert codes == [200] * 16

"""``gateway`` in front of two ``serve`` backends (tiny model), and the load generator
against a ``serve`` instance and against the gateway, all over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json

import httpx
import pytest
from concurrency import call_at_once

from tokenfair.workloads.workload import TraceRow


@pytest.fixture(scope="module")
def stack(tiny_model_dir, h):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    s1, t1 = h.start_serve(tiny_model_dir)
    s2, t2 = h.start_serve(tiny_model_dir)
    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), [t1.url, t2.url + "/v1"], max_context=256)
    gt = ServerThread(create_app(gw), gw).start()
    yield {"serve": [(s1, t1), (s2, t2)], "gw": gw, "gt": gt, "contract": contract}
    gt.stop()
    t1.stop()
    t2.stop()


def test_gateway_completion_matches_backend(stack, h):
    gt, (_, t1) = stack["gt"], stack["serve"][0]
    body = {"prompt": "the quick brown fox", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    direct = httpx.post(t1.url + "/v1/completions", json=body, headers=h.auth("a"), timeout=30).json()
    via = httpx.post(gt.url + "/v1/completions", json=body, headers=h.auth("a"), timeout=30)
    assert via.status_code == 200, via.text
    vb = via.json()
    assert vb["choices"][0]["text"] == direct["choices"][0]["text"]
    assert vb["usage"] == direct["usage"]
    assert vb["model"] == "tiny"
    rec = [r for r in stack["gw"].records.items if r["request_id"] == via.headers["x-request-id"]][0]
    # the gateway's estimated prompt size was corrected by the backend's usage
    assert rec["prompt_tokens"] == direct["usage"]["prompt_tokens"] and rec["output_tokens"] == 6
    assert rec["status"] == "finished" and rec["mode"] == "gateway"
    # model ids: from the backends' /v1/models when the gateway has a backend key, else learned
    # from their responses
    models = httpx.get(gt.url + "/v1/models", headers=h.auth("a")).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_gateway_streaming_chat(stack, h):
    gt = stack["gt"]
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", gt.url + "/v1/chat/completions", json=body, headers=h.auth("b"), timeout=30) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 5 and chunks[-1]["choices"] == []
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] == "length") == 1


def test_gateway_errors(stack, h):
    gt = stack["gt"]
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": 5}, headers=h.auth("a"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": [1] * 300}, headers=h.auth("a"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"   # as OpenAI answers
    assert r.headers["x-should-retry"] == "false"
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x"}, headers={**h.auth("b"), "x-tokenfair-class": "realtime"})
    assert r.status_code == 403
    # a backend's own 4xx is passed on (here: the backend rejects the model name)
    r = httpx.post(gt.url + "/v1/completions", json={"prompt": "x", "model": "nope"}, headers=h.auth("a"), timeout=30)
    assert r.status_code == 404
    assert httpx.get(gt.url + "/healthz").json()["backends_up"]


def test_gateway_spreads_over_both_backends(stack, h):
    gt, gw = stack["gt"], stack["gw"]
    before = [len(s.records.items) for s, _ in stack["serve"]]

    def call(i):
        return httpx.post(gt.url + "/v1/completions", timeout=60, headers=h.auth("a" if i % 2 else "b"),
                          json={"prompt": f"fair scheduling {i}", "max_tokens": 24, "ignore_eos": True}).status_code
    assert call_at_once(call, 10, 60) == [200] * 10
    after = [len(s.records.items) for s, _ in stack["serve"]]
    assert all(a > b for a, b in zip(after, before)), (before, after)
    text = httpx.get(gt.url + "/metrics").text
    assert "tokenfair_backend_window{" in text and "tokenfair_backend_inflight{" in text
    assert 'tokenfair_requests_total{class="batch",status="finished",tenant="b"}' in text
    assert not gw.jobs and all(b.inflight == 0 for b in gw.backends)


def _rows(n=12):
    rows = []
    for i in range(n):
        tenant = "heavy" if i % 3 else "light"
        rows.append(TraceRow(request_id=f"r{i}", arrival_s=0.04 * i, tenant=tenant, prompt_tokens=6 + i % 5,
                             output_tokens=4 + i % 4, klass="batch" if i == 5 else None))
    return rows


@pytest.mark.parametrize("target", ["serve", "gateway"])
def test_load_generator(stack, h, tmp_path, target):
    from tokenfair.serve.load import LoadConfig, run_load

    url = stack["gt"].url if target == "gateway" else stack["serve"][0][1].url
    keys = {"heavy": h.KEYS["heavy"], "light": h.KEYS["light"]}
    rows = _rows()
    cfg = LoadConfig(url=url, keys=keys, seed=1, timeout_s=60)
    records, summary, timeline = run_load(rows, cfg, stack["contract"], tmp_path / target, "tiny-trace")
    assert len(records) == len(rows)
    by_id = {r["request_id"]: r for r in records}
    for row in rows:
        rec = by_id[row.request_id]
        assert rec["status"] == "finished", rec
        assert rec["output_tokens"] == row.output_tokens        # ignore_eos honoured
        assert rec["first_token_s"] >= rec["arrival_s"] and rec["finish_s"] >= rec["first_token_s"]
        assert rec["prompt_tokens"] >= row.prompt_tokens          # server-side count (BPE: >= words)
    assert by_id["r5"]["class"] == "batch"
    out = tmp_path / target
    assert (out / "requests.jsonl").read_text().count("\n") == len(rows)
    s = json.loads((out / "summary.json").read_text())
    assert set(s["tenants"]) == {"heavy", "light"} and s["status"] == {"finished": len(rows)}
    assert s["tenants"]["light"]["ttft_s"]["p50"] is not None and "fairness" in s and s["mode"] == "load"
    assert s["model"] == "tiny"
    tl = json.loads((out / "timeline.json").read_text())
    served = sum(sum(v.values()) for v in tl["tenant_service"].values())
    c = stack["contract"].costs
    assert served == pytest.approx(sum(c.prefill_token * r["prompt_tokens"] + c.decode_token * r["output_tokens"]
                                       for r in records))

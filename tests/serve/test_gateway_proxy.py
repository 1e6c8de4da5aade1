"""The gateway's backend proxy built alone (no Gateway; httpx's MockTransport as the backend):
streamed tokens charged one by one and corrected by usage, refusals re-queued or passed on."""

from __future__ import annotations

import asyncio
import json

import httpx

from gateway_parts_helpers import Clock, backends, book_for, job
from tokenfair.core.request import Status
from tokenfair.serve.gateway_backend import BackendProxy
from tokenfair.serve.gateway_health import HealthConfig
from tokenfair.serve.jobs import Delta, Done


class Signals:
    def __init__(self) -> None:
        self.down: list[str] = []
        self.suspects: list[str] = []

    def mark_down(self, b, why):
        self.down.append(why)

    def suspect(self, b, why):
        self.suspects.append(why)


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def run_proxy(h, handler, backend_key=None):
    """(job, served charges, signals, book records) after proxying one job through ``handler``."""
    bs = backends(1)
    book, records, _, _ = book_for(bs)
    served, signals, clock = [], Signals(), Clock()
    proxy = BackendProxy(HealthConfig(), backend_key=backend_key, backend_priority=False, now=clock,
                         on_served=lambda req, p, n, now: served.append((p, n)), wake=lambda: None,
                         endings=book, signals=signals)
    j = job(h.service_contract())
    j.req.status = Status.RUNNING
    book.add(j)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await proxy.run(client, j, bs[0])

    asyncio.run(scenario())
    return j, served, signals, records, bs[0]


def drain_events(j) -> list:
    out = []
    while not j.q.empty():
        out.append(j.q.get_nowait())
    return out


def test_proxy_streams_tokens_charges_each_and_corrects_by_usage(h):
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, json.loads(request.content), request.headers.get("authorization")))
        return httpx.Response(200, content=sse({"model": "m", "choices": [{"text": "he"}]},
                                               {"choices": [{"text": "llo", "finish_reason": "length"}]},
                                               {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}}))

    j, served, signals, records, b = run_proxy(h, handler, backend_key="admin")
    path, body, auth = sent[0]
    assert path == "/v1/completions" and body["stream"] and body["stream_options"] == {"include_usage": True}
    assert auth == "Bearer admin" and body["vllm_xargs"]["tenant"] == "a"
    events = drain_events(j)
    assert [e.text for e in events if isinstance(e, Delta)] == ["he", "llo"]
    done = events[-1]
    assert isinstance(done, Done) and (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("length", 12, 3)
    assert served == [(8, 1), (0, 1), (4, 1)]        # first token with the prompt estimate, then usage's extra
    assert j.req.status is Status.FINISHED and j.model == "m" and b.served == 1 and b.models == ["m"]
    assert b.ttft_ewma_s == 0.0 and not signals.down and records[0][2]["finish_reason"] == "length"


def test_proxy_backend_refusals_requeue_or_pass_on(h):
    def overloaded(request):
        return httpx.Response(503, json={"error": {"message": "busy", "code": "overloaded"}})

    j, _, _, _, b = run_proxy(h, overloaded)
    assert j.req.status is Status.WAITING and j.retries == 1 and b.window.decreases == 1

    def bad_request(request):
        return httpx.Response(400, json={"error": {"message": "too long", "code": "context_length_exceeded",
                                                   "param": "prompt"}})

    j, _, _, _, _ = run_proxy(h, bad_request)
    ev = drain_events(j)[-1]
    assert j.req.status is Status.FAILED and j.retries == 0
    assert (ev.status, ev.code, ev.param, ev.message) == (400, "context_length_exceeded", "prompt", "too long")

    def refused(request):
        raise httpx.ConnectError("refused", request=request)

    j, _, signals, _, _ = run_proxy(h, refused)
    assert signals.down == ["ConnectError"] and j.req.status is Status.WAITING and j.retries == 1

"""Shared pieces of the gateway-part tests (test_gateway_prober, _book, _proxy, _dispatcher):
a settable clock, backends, requests, and a job book with recording callbacks."""

from __future__ import annotations

import asyncio

from tokenfair.runtime.intake import make_request
from tokenfair.serve.gateway_jobs import GatewayJob, JobBook
from tokenfair.serve.gateway_window import AdaptiveWindow, Backend, WindowConfig
from tokenfair.serve.jobs import GenRequest
from tokenfair.serve.openai_schema import CompletionRequest
from tokenfair.workloads.workload import TraceRow


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def backends(n: int, window: float = 2.0) -> list[Backend]:
    out = [Backend(f"http://10.0.0.{i + 1}:8000/v1", AdaptiveWindow(WindowConfig(initial=window, max=window)))
           for i in range(n)]
    for b in out:
        b.name = b.url.split("://", 1)[1].removesuffix("/v1")
    return out


def gen(tenant: str = "a", prompt: str = "abcdefgh", max_tokens: int = 4, rid: str = "r1") -> GenRequest:
    raw = {"prompt": prompt, "max_tokens": max_tokens}
    return GenRequest("completion", rid, tenant, CompletionRequest.model_validate(raw), raw)


def job(contract, tenant: str = "a", rid: str = "r1", prompt_tokens: int = 8) -> GatewayJob:
    row = TraceRow(request_id=rid, arrival_s=0.0, tenant=tenant, prompt_tokens=prompt_tokens, output_tokens=1,
                   max_tokens=4)
    req, reject = make_request(row, int(rid.lstrip("r")), contract)
    assert reject is None
    return GatewayJob(gen(tenant, rid=rid), req)


class RecordingPolicy:
    """The policy calls the job book makes, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def discard(self, req):
        self.calls.append(("discard", req.request_id))

    def on_finish(self, req, now):
        self.calls.append(("on_finish", req.request_id))

    def enqueue(self, req, now):
        self.calls.append(("enqueue", req.request_id))


class RecordingPredictor:
    def __init__(self) -> None:
        self.observed: list[tuple[str, int]] = []

    def observe(self, req, n):
        self.observed.append((req.request_id, n))


def book_for(bs, max_retries: int = 2, closing: bool = False):
    records, preempted, wakes = [], [], []
    book = JobBook(RecordingPolicy(), RecordingPredictor(), bs, max_retries=max_retries, now=Clock(),
                   record=lambda req, **kw: records.append((req.request_id, req.status, kw)),
                   preempted=preempted.append, closing=lambda: closing, wake=lambda: wakes.append(1))
    return book, records, preempted, wakes


async def cancel_all(book: JobBook) -> None:
    tasks = [j.task for j in book.running]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)


def bound_policy(contract):
    from tokenfair.core.costmodel import Profile
    from tokenfair.core.kv import BlockPool
    from tokenfair.sched.predictor import OnlinePredictor
    from tokenfair.sched.registry import make_policy

    policy = make_policy("fair")
    prof = Profile(name="t", kind="linear", prefill_batch_s=0.01, prefill_token_s=2e-4, decode_base_s=0.02,
                   overhead_s=0.0, kv_capacity_tokens=1 << 40, block_size=16)
    policy.bind(contract, prof, BlockPool(prof.num_blocks, prof.block_size), OnlinePredictor())
    return policy

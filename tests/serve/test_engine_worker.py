"""serve's engine worker built alone (no EngineBackend, no model, no HTTP): the real iteration
scheduler stepping a fake engine (the simulator's engine, sampling one token id per request
per step) in the worker thread, tokens and terminal states handed to the asyncio side."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

from tokenfair.core.costmodel import Profile
from tokenfair.core.reasons import Reason, ReasonCode
from tokenfair.core.request import Status
from tokenfair.runtime.intake import make_request
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.serve.engine_job import ServeJob
from tokenfair.serve.engine_worker import MAX_ENGINE_ERRORS, EngineWorker
from tokenfair.serve.jobs import Delta, Done, Failed, GenRequest
from tokenfair.serve.openai_schema import CompletionRequest
from tokenfair.sim.engine import SimEngine
from tokenfair.workloads.workload import TraceRow

PROFILE = Profile(name="tiny", kind="linear", prefill_batch_s=0.01, prefill_token_s=0.001,
                  decode_base_s=0.01, decode_seq_s=0.0001, decode_ctx_s=0.0, overhead_s=0.0,
                  kv_capacity_tokens=4096, block_size=16)
TOKEN_ID = 7


class FakeEngine:
    """``add``/``forget``/``execute`` as serve's engine has them: the simulator's engine (every
    request generates exactly its ``max_tokens``), each sampled token sent to ``on_token``."""

    def __init__(self, fail: bool = False) -> None:
        self.sim = SimEngine(PROFILE)
        self.fail = fail
        self.added: list[str] = []
        self.forgotten: list[str] = []
        self.thread_ids: set[int] = set()

    def add(self, req) -> None:
        self.added.append(req.request_id)
        self.sim.add(req, req.max_tokens)

    def forget(self, req) -> None:
        self.forgotten.append(req.request_id)
        self.sim.forget(req)

    def execute(self, out):
        self.thread_ids.add(threading.get_ident())
        if self.fail:
            raise RuntimeError("device lost")
        sampled = [r for r, n in out.prefill if n == r.num_uncomputed] + list(out.decode)
        for req in sampled:
            req.payload.on_token(TOKEN_ID, None)
        return self.sim.execute(out)


def make_worker(contract, engine: FakeEngine):
    sched = IterationScheduler(make_policy("fair"), contract, PROFILE)
    ended: list[tuple[str, Status]] = []
    jobs: dict[str, ServeJob] = {}
    t0 = time.perf_counter()
    worker = EngineWorker(sched, engine, threading.RLock(), jobs, now=lambda: time.perf_counter() - t0,
                          on_end=lambda job, req: ended.append((req.request_id, req.status)),
                          on_preempted=lambda tenant: None)
    return worker, ended


def submit(worker: EngineWorker, contract, rid: str, tenant: str, max_tokens: int) -> ServeJob:
    """What EngineBackend.submit does once a request is tokenized and past the door."""
    raw = {"prompt": "x", "max_tokens": max_tokens}
    g = GenRequest("completion", rid, tenant, CompletionRequest.model_validate(raw), raw)
    row = TraceRow(request_id=rid, arrival_s=0.0, tenant=tenant, prompt_tokens=20, output_tokens=1,
                   max_tokens=max_tokens)
    req, reject = make_request(row, int(rid.lstrip("r")), contract)
    assert reject is None
    job = ServeJob(g, req, None, [], "tiny")
    req.payload = SimpleNamespace(on_token=lambda tok, fin: job.on_token(tok, fin, worker.dirty),
                                  finish_reason=None)
    with worker.lock:
        worker.sched.add_request(req, worker.now())
        assert req.status is Status.WAITING
        worker.jobs[rid] = job
        worker.add(req)
    worker.wake.set()
    return job


async def events_of(job: ServeJob) -> list:
    out = []
    while not out or isinstance(out[-1], Delta):
        out.append(await asyncio.wait_for(job.next_event(), 10))
    return out


def test_worker_steps_a_fake_engine_and_hands_over_tokens_and_ends(h):
    contract = h.service_contract()
    engine = FakeEngine()
    worker, ended = make_worker(contract, engine)

    async def scenario():
        worker.start(asyncio.get_running_loop())
        jobs = [submit(worker, contract, f"r{i}", "ab"[i % 2], max_tokens=3 + i) for i in range(4)]
        return [await events_of(j) for j in jobs]

    results = asyncio.run(scenario())
    worker.request_stop()
    worker.thread.join(10)
    assert not worker.alive()
    for i, events in enumerate(results):
        deltas, done = events[:-1], events[-1]
        assert isinstance(done, Done) and done.completion_tokens == 3 + i and done.finish_reason == "length"
        assert sum(d.tokens for d in deltas) == 3 + i              # every sampled token delivered
    assert sorted(ended) == [(f"r{i}", Status.FINISHED) for i in range(4)] and not worker.jobs
    assert engine.added == ["r0", "r1", "r2", "r3"]
    assert engine.thread_ids == {worker.thread.ident}                  # the engine runs in the worker only
    assert worker.num_steps >= 6 and worker.broken is None
    assert worker.sched.pool.num_free == worker.sched.pool.num_blocks


def test_worker_fails_a_raising_step_and_breaks_after_max_errors(h):
    contract = h.service_contract()
    engine = FakeEngine(fail=True)
    worker, ended = make_worker(contract, engine)

    async def scenario():
        worker.start(asyncio.get_running_loop())
        out = []
        for i in range(MAX_ENGINE_ERRORS):
            assert worker.broken is None
            out.append(await events_of(submit(worker, contract, f"r{i}", "a", max_tokens=4)))
        return out

    results = asyncio.run(scenario())
    for events in results:
        assert len(events) == 1 and isinstance(events[0], Failed) and events[0].code == "engine_error"
    assert worker.broken == "engine_error: RuntimeError: device lost"
    assert [s for _, s in ended] == [Status.FAILED] * MAX_ENGINE_ERRORS
    assert sorted(set(engine.forgotten)) == ["r0", "r1", "r2"]        # the engine dropped their state
    worker.request_stop()
    worker.thread.join(10)
    assert not worker.alive()


def test_worker_cancel_of_a_waiting_request_ends_it_at_once(h):
    contract = h.service_contract()
    worker, ended = make_worker(contract, FakeEngine())              # not started: nothing runs

    async def scenario():
        job = submit(worker, contract, "r0", "a", max_tokens=4)
        with worker.lock:
            worker.abort_locked(job.req, Reason(ReasonCode.CLIENT_DISCONNECTED, "gone"), worker.now())
            done = worker.drain_ended()
        worker.publish([], done, threadsafe=False)
        return await events_of(job)

    events = asyncio.run(scenario())
    assert isinstance(events[0], Failed) and ended == [("r0", Status.FAILED)]
    assert worker.forgets and worker.forgets[0].request_id == "r0"    # the engine forgets it next step
    assert not worker.jobs and worker.num_steps == 0

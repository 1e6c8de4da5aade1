"""``serve`` mode: the iteration scheduler and the PyTorch ``RealEngine`` behind the HTTP API.

Threads and ownership::

    asyncio thread (uvicorn)                      worker thread (one)
    ------------------------                      -------------------
    submit: tokenize, contract intake,            loop: engine.add(new) ; apply aborts of
      door checks, scheduler.add_request  --lock-- running requests ; schedule ; [execute
      (a rejection is answered at once)            WITHOUT the lock] ; update_from_output ;
    cancel: abort a waiting request now;           hand tokens and terminal states to the
      a running one at the next step boundary      asyncio loop (call_soon_threadsafe, once
    snapshot (/metrics) under the lock             per step)

The scheduler and its policy are only touched under ``lock`` (an RLock); the engine
(``RealEngine`` and its ``ModelRunner``) only by the worker thread.  The engine executes a
step without the lock, so arrivals and queue-side aborts never wait for a forward pass.  A
running request cannot be freed in the middle of a step: its abort is applied right after
the step that is executing (``scheduler.abort`` + ``engine.forget``), which returns its
slot and KV blocks to the scheduler's pool and to the runner's cache at once.  A waiting
request's abort frees its queue slot immediately.

Per-request streaming: the engine's ``on_token`` callback (worker thread) buffers token ids;
after each step they are delivered to each request's asyncio queue in one
``call_soon_threadsafe``; the job detokenizes incrementally and applies stop strings.
Terminal states come from the scheduler (``update_from_output`` / ``abort`` / expiry) and
are delivered after the step's tokens, so a response always ends with them.

Parts: ``EngineBackend`` (a :class:`~tokenfair.serve.service.Service`: intake, tokenizing,
door checks, records, metrics) holds ``sched`` (the iteration scheduler and its policy) and
``worker`` (:class:`~tokenfair.serve.engine_worker.EngineWorker`: the thread, its queues and
the engine's health), sharing ``lock`` and ``jobs`` with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.reasons import CLIENT_CLOSED, Reason, ReasonCode
from ..core.request import Request, Status
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from .errors import ServiceError
from .jobs import GenRequest, Job, RecordSink
from .service import Service
from .auth import KeyRing
from .engine_intake import context_refusal, prompt_chars, sampling_of, tokenize_prompt
from .engine_job import IncrementalDetokenizer, ServeJob
from .limits import max_token_chars, min_prompt_tokens
from .engine_worker import IDLE_POLL_S, MAX_ENGINE_ERRORS, EngineWorker

ENGINE_STOPPED = Reason(ReasonCode.SHUTDOWN, "engine stopped")   # the worker is gone with requests held

# The parts live in engine_job (request bridge) and engine_worker (worker thread); the
# public names stay importable from here.
__all__ = [
    "IDLE_POLL_S", "MAX_ENGINE_ERRORS", "IncrementalDetokenizer", "ServeJob", "EngineBackend",
    "build_engine_service",
]


SHUTDOWN_POLL_S = 0.02     # drain: how often to look whether the held jobs have ended
ABORT_WAIT_S = 5.0         # drain: how long failed jobs may take to end after the grace period
JOIN_TIMEOUT_S = 10.0      # stop: how long to wait for the worker thread


class EngineBackend(Service):
    mode = "serve"

    def __init__(self, contract: Contract, keyring: KeyRing, engine, profile: Profile, *, policy: str = "fair",
                 served_model: str | None = None, max_tokens_default: int = 256,
                 records: RecordSink | None = None, max_tenant_labels: int = 20) -> None:
        from ..engine.setup import model_name
        super().__init__(contract, keyring, records=records, max_tenant_labels=max_tenant_labels)
        self.engine = engine
        self.loaded = engine.loaded
        self.profile = profile
        self.sched = IterationScheduler(make_policy(policy), contract, profile)
        self.policy = self.sched.policy
        self.policy_name = policy
        self.lock = threading.RLock()
        self.policy_lock = self.lock
        self.served_model = served_model or (model_name(self.loaded) if self.loaded is not None else "model")
        self.max_tokens_default = max_tokens_default
        pool = self.sched.pool
        self.capacity_tokens = pool.num_blocks * pool.block_size
        self.max_context = min(engine.config.max_position, self.capacity_tokens)
        self.vocab_size = engine.config.vocab_size
        self.max_token_chars: int | None = None   # longest vocabulary entry (the length pre-check)
        self.jobs: dict[str, ServeJob] = {}
        self.worker = EngineWorker(self.sched, engine, self.lock, self.jobs, now=self.now, on_end=self._recorded,
                                   on_preempted=self.metrics.preempted)

    def _recorded(self, job: ServeJob, req: Request) -> None:
        """``req``'s terminal record (the worker calls it once per ended job)."""
        if req.status is Status.REJECTED:
            self.metrics.rejected(req.tenant, req.reason_code)
        fin = getattr(req.payload, "finish_reason", None) if req.status is Status.FINISHED else None
        self.record(req, endpoint=job.g.kind, finish_reason=fin)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.worker.start(asyncio.get_running_loop())

    def model_names(self) -> list[str]:
        return [self.served_model]

    def health(self) -> tuple[bool, dict]:
        alive = self.worker.alive()
        broken = self.worker.broken
        ok = alive and not self.closing and broken is None
        return ok, {"mode": self.mode, "model": self.served_model, "closing": self.closing,
                    "engine": "broken: " + broken if broken else ("running" if alive else "stopped"),
                    "running": len(self.sched.running), "waiting": self.policy.num_waiting(),
                    "kv_free_blocks": self.sched.pool.num_free, "kv_blocks": self.sched.pool.num_blocks}

    async def drain(self, grace_s: float) -> None:
        worker = self.worker
        deadline = time.monotonic() + max(0.0, grace_s)
        while self.jobs and time.monotonic() < deadline and worker.alive():
            await asyncio.sleep(SHUTDOWN_POLL_S)
        if self.jobs:
            worker.fail_all(Reason(ReasonCode.SHUTDOWN, "the server is stopping (grace period over)"))
            end = time.monotonic() + ABORT_WAIT_S
            while self.jobs and time.monotonic() < end and worker.alive():
                await asyncio.sleep(0.01)
        if self.jobs:     # the worker is gone: end them here
            with self.lock:
                for job in list(self.jobs.values()):
                    if not job.req.status.is_terminal:
                        self.sched.abort(job.req, Status.FAILED, ENGINE_STOPPED, self.now())
                ended = worker.drain_ended()
            worker.publish([], ended, threadsafe=False)

    async def stop(self) -> None:
        self.worker.request_stop()
        if self.worker.thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.worker.thread.join, JOIN_TIMEOUT_S)
        self.engine.close()
        await super().stop()

    # ------------------------------------------------------------------ intake
    async def prepare(self, g: GenRequest) -> None:
        """Refuse a prompt whose length alone exceeds the context (no tokenizer call), then
        tokenize/template it in a worker thread: the event loop never waits for it."""
        self._check_model(g)
        chars = prompt_chars(g)
        bound = g.min_prompt_tokens            # from body_precheck, for a big body
        if chars is not None and self.loaded is not None:
            bound = max(bound, min_prompt_tokens(chars, self.prompt_bounds()[1]))
        if bound >= self.max_context:
            self._refuse_context(g, bound, None)
        g.prompt_ids = await run_in_threadpool(tokenize_prompt, g, self.loaded, self.vocab_size)

    def prompt_bounds(self) -> tuple[int | None, int | None]:
        if self.loaded is None:
            return self.max_context, None
        if self.max_token_chars is None:
            self.max_token_chars = max_token_chars(self.loaded)
        return self.max_context, self.max_token_chars

    def _check_model(self, g: GenRequest) -> None:
        if g.model and g.model not in self.model_names():
            raise ServiceError(404, f"model {g.model!r} does not exist; this server serves {self.served_model!r}",
                               ReasonCode.MODEL_NOT_FOUND, "model")

    def _refuse_context(self, g: GenRequest, n: int, asked: int | None) -> None:
        refusal = context_refusal(n, asked, self.max_context, g)
        if refusal is not None:
            now = self.now()
            req = self.intake(g, n, 1, now)
            raise self.refuse(req, refusal[0], now, endpoint=g.kind, param=refusal[1])

    def submit(self, g: GenRequest) -> ServeJob:
        from ..engine.sequence import GenerationPayload

        body = g.body
        self._check_model(g)
        sampling = sampling_of(body)              # before intake: a bad parameter is a plain 400
        ids = g.prompt_ids if g.prompt_ids is not None else tokenize_prompt(g, self.loaded, self.vocab_size)
        if not ids:
            raise ServiceError(400, "prompt: the prompt is empty", ReasonCode.INVALID_REQUEST, "prompt")
        stops = body.stop_list()
        if stops and (self.loaded is None or self.loaded.tokenizer is None):
            raise ServiceError(400, "stop: stop strings need a tokenizer", ReasonCode.INVALID_REQUEST, "stop")
        n = len(ids)
        asked = body.requested_max_tokens()
        self._refuse_context(g, n, asked)
        now = self.now()
        max_tokens = asked if asked is not None else min(self.max_tokens_default, self.max_context - n)
        req = self.intake(g, n, max_tokens, now)
        decode = None
        if self.loaded is not None and self.loaded.tokenizer is not None:
            decode = self.loaded.decode
        job = ServeJob(g, req, decode, stops, self.served_model)
        dirty = self.worker.dirty
        req.payload = GenerationPayload(prompt_ids=ids, sampling=sampling, max_new_tokens=max_tokens,
                                        stop_strings=tuple(stops), ignore_eos=body.ignore_eos,
                                        on_token=lambda tok, fin: job.on_token(tok, fin, dirty))
        with self.lock:
            broken = self.worker.broken
            if self.closing or broken is not None:
                why = Reason(ReasonCode.SHUTTING_DOWN, "the server is stopping") if self.closing \
                    else Reason(ReasonCode.NO_BACKEND, f"engine broken ({broken})")
                raise self.refuse(req, why, now, endpoint=g.kind)
            door = self.door_check(req, now)
            if door is not None:
                raise self.refuse(req, door[0], now, retry_after=door[1], endpoint=g.kind)
            self.sched.add_request(req, now)
            if req.status is Status.REJECTED:
                self.sched.forget_ended(req)
                raise self.refuse(req, None, now, endpoint=g.kind)
            self.jobs[req.request_id] = job
            self.worker.add(req)
        self.worker.wake.set()
        return job

    def cancel(self, job: Job, reason: Reason = CLIENT_CLOSED) -> None:
        req = job.req
        with self.lock:
            if req.status.is_terminal or req.request_id not in self.jobs:
                return
            running = req.status is Status.RUNNING
            self.worker.abort_locked(req, reason, self.now())
            ended = [] if running else self.worker.drain_ended()
        self.worker.publish([], ended, threadsafe=False)
        self.worker.wake.set()

    # ------------------------------------------------------------------ metrics
    def snapshot(self) -> dict:
        with self.lock:
            now = self.now()
            queue: Counter = Counter()
            for job in list(self.jobs.values()):
                r = job.req
                if r.status in (Status.WAITING, Status.SWAPPED):
                    queue[(r.tenant, r.klass)] += 1
            running = Counter(r.tenant for r in self.sched.running)
            share, entitled = self.share_snapshot(now)
            pool = self.sched.pool
            extra: list[tuple[str, str, tuple, dict[Any, float]]] = [
                ("tokenfair_kv_usage_ratio", "Fraction of KV blocks in use", (), {(): pool.usage}),
                ("tokenfair_kv_free_blocks", "Free KV blocks", (), {(): pool.num_free}),
            ]
            counters = [("tokenfair_engine_steps", "Engine steps executed", float(self.worker.num_steps))]
        return {"queue": dict(queue), "running": dict(running), "share": share, "entitled": entitled, "extra": extra,
                "counters": counters}


def build_engine_service(model: str, contract: Contract, keyring: KeyRing, *, threads: int = 2,
                         kv_tokens: int | None = None, block_size: int = 16, policy: str = "fair",
                         profile: Profile | None = None, served_model: str | None = None,
                         max_tokens_default: int = 256, records: RecordSink | None = None,
                         seed: int = 0, max_tenant_labels: int = 20) -> EngineBackend:
    """Load ``model`` ("default", a .gguf file or an HF folder) and wrap it in a service."""
    from ..engine.setup import make_real_setup

    make_policy(policy)      # fail early on a bad policy name
    num_blocks = None if kv_tokens is None else max(1, kv_tokens // block_size)
    prof, engine = make_real_setup(model, contract, profile, num_blocks=num_blocks, block_size=block_size,
                                   num_threads=threads, seed=seed, keep_step_log=False)
    return EngineBackend(contract, keyring, engine, prof, policy=policy, served_model=served_model,
                         max_tokens_default=max_tokens_default, records=records,
                         max_tenant_labels=max_tenant_labels)

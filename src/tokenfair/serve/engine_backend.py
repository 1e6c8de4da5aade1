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
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter, deque
from typing import Any

from ..contract import Contract
from ..costmodel import Profile
from ..request import Request, Status
from ..sched.interface import StepResult
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from .app import Delta, Done, GenRequest, Job, RecordSink, Service, ServiceError, failed_event
from .auth import KeyRing

IDLE_POLL_S = 0.05        # wake-up period while requests wait but nothing can run (expiry, rate limits)
MAX_ENGINE_ERRORS = 3      # consecutive step exceptions before the engine is declared broken


class IncrementalDetokenizer:
    """Text deltas from a growing list of token ids (holds back incomplete UTF-8)."""

    def __init__(self, decode) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        prefix_text = self.decode(self.ids[self.prefix:self.read])
        new_text = self.decode(self.ids[self.prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        prefix_text = self.decode(self.ids[self.prefix:self.read])
        new_text = self.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""


class ServeJob(Job):
    def __init__(self, g: GenRequest, req: Request, decode, stops: list[str], model: str) -> None:
        super().__init__(g, req)
        self.model = model
        self.q: asyncio.Queue = asyncio.Queue()
        self.ready: deque = deque()
        self.detok = IncrementalDetokenizer(decode) if decode is not None else None
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""
        self.stopped = False
        self.buf: list[int] = []        # token ids sampled in the current step (worker thread)
        self.ended = False

    # worker thread
    def on_token(self, token_id: int | None, finish_reason: str | None, dirty: list) -> None:
        if token_id is None:
            return
        if not self.buf:
            dirty.append(self)
        self.buf.append(token_id)

    # asyncio thread
    def _text(self, delta: str, final: bool) -> str:
        if self.stopped:
            return ""
        self.pending += delta
        if self.stops:
            hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
            if hits:
                out, self.pending, self.stopped = self.pending[:min(hits)], "", True
                return out
            if not final and self.hold:
                cut = max(0, len(self.pending) - self.hold)
                out, self.pending = self.pending[:cut], self.pending[cut:]
                return out
        out, self.pending = self.pending, ""
        return out

    def _consume(self, item) -> None:
        kind = item[0]
        if kind == "tok":
            ids = item[1]
            text = self.detok.push(ids) if self.detok is not None else ""
            self.ready.append(Delta(self._text(text, False), len(ids)))
            return
        req = self.req
        if req.status is Status.FINISHED:
            tail = self.detok.flush() if self.detok is not None else ""
            text = self._text(tail, True)
            if text:
                self.ready.append(Delta(text, 0))
            payload = req.payload
            reason = getattr(payload, "finish_reason", None)
            if reason not in ("stop", "length"):
                reason = "length" if req.num_output >= req.max_tokens else "stop"
            if self.stopped:
                reason = "stop"
            self.ready.append(Done(reason, req.prompt_tokens, len(getattr(payload, "output_ids", ())) or req.num_output))
        else:
            self.ready.append(failed_event(req))
        self.finished.set()

    async def next_event(self):
        while not self.ready:
            self._consume(await self.q.get())
        return self.ready.popleft()


class EngineBackend(Service):
    mode = "serve"

    def __init__(self, contract: Contract, keyring: KeyRing, engine, profile: Profile, *, policy: str = "fair",
                 served_model: str | None = None, max_tokens_default: int = 256,
                 records: RecordSink | None = None, max_tenant_labels: int = 20) -> None:
        from ..engine.real import model_name
        super().__init__(contract, keyring, records=records, max_tenant_labels=max_tenant_labels)
        self.engine = engine
        self.loaded = engine.loaded
        self.profile = profile
        self.sched = IterationScheduler(make_policy(policy), contract, profile)
        self.policy = self.sched.policy
        self.policy_name = policy
        self.lock = threading.RLock()
        self.policy_lock = self.lock
        self.wake = threading.Event()
        self.served_model = served_model or (model_name(self.loaded) if self.loaded is not None else "model")
        self.max_tokens_default = max_tokens_default
        pool = self.sched.pool
        self.capacity_tokens = pool.num_blocks * pool.block_size
        self.max_context = min(engine.config.max_position, self.capacity_tokens)
        self.vocab_size = engine.config.vocab_size
        self.jobs: dict[str, ServeJob] = {}
        self._adds: list[Request] = []
        self._aborts: list[tuple[Request, Status, str]] = []
        self._forget: list[Request] = []
        self._dirty: list[ServeJob] = []
        self._stop = False
        self.broken: str | None = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.num_steps = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.thread is not None:
            return
        self.loop = asyncio.get_running_loop()
        self.thread = threading.Thread(target=self._run, name="tokenfair-engine", daemon=True)
        self.thread.start()

    def model_names(self) -> list[str]:
        return [self.served_model]

    def health(self) -> tuple[bool, dict]:
        alive = self.thread is not None and self.thread.is_alive()
        ok = alive and not self.closing and self.broken is None
        return ok, {"mode": self.mode, "model": self.served_model, "closing": self.closing,
                    "engine": "broken: " + self.broken if self.broken else ("running" if alive else "stopped"),
                    "running": len(self.sched.running), "waiting": self.policy.num_waiting(),
                    "kv_free_blocks": self.sched.pool.num_free, "kv_blocks": self.sched.pool.num_blocks}

    async def drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + max(0.0, grace_s)
        while self.jobs and time.monotonic() < deadline and self.thread is not None and self.thread.is_alive():
            await asyncio.sleep(0.02)
        if self.jobs:
            self._fail_all("shutdown: the server is stopping (grace period over)")
            end = time.monotonic() + 5.0
            while self.jobs and time.monotonic() < end and self.thread is not None and self.thread.is_alive():
                await asyncio.sleep(0.01)
        if self.jobs:     # the worker is gone: end them here
            with self.lock:
                for job in list(self.jobs.values()):
                    if not job.req.status.is_terminal:
                        self.sched._end(job.req, Status.FAILED, "shutdown: engine stopped", self.now())
                ended = self._drain_ended()
            self._publish([], ended, threadsafe=False)

    async def stop(self) -> None:
        self._stop = True
        self.wake.set()
        if self.thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.thread.join, 10.0)
        self.engine.close()
        await super().stop()

    def _fail_all(self, reason: str) -> None:
        now = self.now()
        with self.lock:
            for job in list(self.jobs.values()):
                req = job.req
                if req.status.is_terminal:
                    continue
                if req.status is Status.RUNNING:
                    self._aborts.append((req, Status.FAILED, reason))
                else:
                    self.sched.abort(req, Status.FAILED, reason, now)
                    self._forget.append(req)
            ended = self._drain_ended()
        self._publish([], ended, threadsafe=False)
        self.wake.set()

    # ------------------------------------------------------------------ intake
    def _prompt_ids(self, g: GenRequest) -> list[int]:
        body = g.body
        loaded = self.loaded
        if g.kind == "chat":
            if loaded is None or loaded.tokenizer is None:
                raise ServiceError(400, "this model has no tokenizer; use /v1/completions with token ids",
                                   "no_tokenizer", "messages")
            msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
            try:
                text = loaded.apply_chat_template(msgs)
            except Exception as err:  # noqa: BLE001 - template errors are the request's fault
                raise ServiceError(400, f"messages: cannot apply the chat template: {err}", "invalid_request",
                                   "messages") from None
            return loaded.encode(text)
        prompt = body.prompt
        if isinstance(prompt, str):
            if loaded is None or loaded.tokenizer is None:
                raise ServiceError(400, "this model has no tokenizer; send prompt as token ids", "no_tokenizer", "prompt")
            return loaded.encode(prompt)
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ServiceError(400, f"prompt: token id {bad[0]} outside the vocabulary [0, {self.vocab_size})",
                               "invalid_request", "prompt")
        return list(prompt)

    def submit(self, g: GenRequest) -> ServeJob:
        from ..engine.real import GenerationPayload
        from ..engine.sampling import SamplingParams

        body = g.body
        if g.model and g.model not in self.model_names():
            raise ServiceError(404, f"model {g.model!r} does not exist; this server serves {self.served_model!r}",
                               "model_not_found", "model")
        ids = self._prompt_ids(g)
        if not ids:
            raise ServiceError(400, "prompt: the prompt is empty", "invalid_request", "prompt")
        stops = body.stop_list()
        if stops and (self.loaded is None or self.loaded.tokenizer is None):
            raise ServiceError(400, "stop: stop strings need a tokenizer", "invalid_request", "stop")
        n = len(ids)
        now = self.now()
        asked = body.requested_max_tokens()
        room = self.max_context - n
        if room < 1:
            req = self.intake(g, n, 1, now)
            raise self.refuse(req, f"context_length_exceeded: the prompt has {n} tokens; this model's context "
                                   f"holds {self.max_context} tokens (prompt + output)", now, endpoint=g.kind)
        max_tokens = min(asked if asked is not None else self.max_tokens_default, room)
        req = self.intake(g, n, max_tokens, now)
        temperature = 1.0 if body.temperature is None else body.temperature
        try:
            sampling = SamplingParams(temperature=temperature, top_p=1.0 if body.top_p is None else body.top_p,
                                      seed=body.seed)
        except ValueError as err:
            raise ServiceError(400, str(err), "invalid_request") from None
        decode = None
        if self.loaded is not None and self.loaded.tokenizer is not None:
            decode = self.loaded.decode
        job = ServeJob(g, req, decode, stops, self.served_model)
        dirty = self._dirty
        req.payload = GenerationPayload(prompt_ids=ids, sampling=sampling, max_new_tokens=max_tokens,
                                        stop_strings=tuple(stops), ignore_eos=body.ignore_eos,
                                        on_token=lambda tok, fin: job.on_token(tok, fin, dirty))
        with self.lock:
            if self.closing or self.broken is not None:
                why = "shutting_down: the server is stopping" if self.closing else f"no_backend: engine broken ({self.broken})"
                raise self.refuse(req, why, now, endpoint=g.kind)
            door = self.door_check(req, now)
            if door is not None:
                raise self.refuse(req, door[0], now, retry_after=door[1], endpoint=g.kind)
            self.sched.add_request(req, now)
            if req.status is Status.REJECTED:
                self.sched.ended = [r for r in self.sched.ended if r is not req]
                raise self.refuse(req, req.reason, now, endpoint=g.kind)
            self.jobs[req.request_id] = job
            self._adds.append(req)
        self.wake.set()
        return job

    def cancel(self, job: Job, reason: str = "client_disconnected: the client closed the connection") -> None:
        req = job.req
        with self.lock:
            if req.status.is_terminal or req.request_id not in self.jobs:
                return
            if req.status is Status.RUNNING:
                self._aborts.append((req, Status.FAILED, reason))
                ended = []
            else:
                self.sched.abort(req, Status.FAILED, reason, self.now())
                self._forget.append(req)
                ended = self._drain_ended()
        self._publish([], ended, threadsafe=False)
        self.wake.set()

    # ------------------------------------------------------------------ worker
    def _drain_ended(self) -> list[Request]:
        ended, self.sched.ended = self.sched.ended, []
        return ended

    def _publish(self, tokens: list[tuple[ServeJob, list[int]]], ended: list[Request], threadsafe: bool) -> None:
        items: list[tuple[ServeJob, tuple]] = [(job, ("tok", ids)) for job, ids in tokens]
        for req in ended:
            job = self.jobs.pop(req.request_id, None)
            if job is None or job.ended:
                continue
            job.ended = True
            if req.status is Status.REJECTED:
                self.metrics.rejected(req.tenant, req.reason)
            fin = getattr(req.payload, "finish_reason", None) if req.status is Status.FINISHED else None
            self.record(req, endpoint=job.g.kind, finish_reason=fin)
            items.append((job, ("end",)))
        if not items:
            return
        if threadsafe and self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:       # the event loop is closed (process exit)
                pass
        else:
            _deliver(items)

    def _take_tokens(self) -> list[tuple[ServeJob, list[int]]]:
        out = []
        for job in self._dirty:
            out.append((job, job.buf))
            job.buf = []
        self._dirty.clear()
        return out

    def _prepare_locked(self, now: float) -> None:
        """Apply what the HTTP side queued: engine adds, aborts of running requests, forgets."""
        eng = self.engine
        for req in self._forget:
            eng.forget(req)
        self._forget.clear()
        for req in self._adds:
            if req.status.is_terminal:
                continue
            try:
                eng.add(req)
            except ValueError as err:
                self.sched.abort(req, Status.FAILED, f"engine_rejected: {err}", now)
        self._adds.clear()
        for req, status, reason in self._aborts:
            if not req.status.is_terminal:
                self.sched.abort(req, status, reason, now)
            eng.forget(req)
        self._aborts.clear()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as err:  # noqa: BLE001 - a scheduler/engine bug: fail everything, never hang
            self._die(err)

    def _die(self, err: Exception) -> None:
        import logging
        logging.getLogger("tokenfair.serve").exception("engine worker stopped: %s", err)
        self.broken = f"{type(err).__name__}: {err}"
        now = self.now()
        with self.lock:
            ended = []
            for job in list(self.jobs.values()):
                r = job.req
                if not r.status.is_terminal:
                    r.status, r.reason, r.finish_s = Status.FAILED, f"engine_error: worker stopped ({self.broken})", now
                ended.append(r)
        self._publish([], ended, threadsafe=True)

    def _loop(self) -> None:
        errors = 0
        while True:
            self.wake.clear()
            out = None
            sleep = 1.0
            with self.lock:
                if self._stop:
                    break
                now = self.now()
                self._prepare_locked(now)
                if self.sched.has_work():
                    out = self.sched.schedule(now)
                    if out.is_empty and not out.preempted:
                        self._forget.extend(out.aborted)
                        wake = self.sched.policy_wakeup(now)
                        if not self.sched.running and wake == math.inf and self.policy.num_waiting():
                            self.sched.fail_waiting("unschedulable: no resource can ever admit it", now)
                        sleep = min(max(0.0, wake - now), IDLE_POLL_S)
                        out = None
                ended = self._drain_ended()
                for req in ended:
                    if out is None or req not in out.aborted:
                        self._forget.append(req)
            self._publish([], ended, threadsafe=True)
            if out is None:
                if not self._forget:
                    self.wake.wait(sleep)
                continue
            try:
                result = self.engine.execute(out)
                errors = 0
            except Exception as err:  # noqa: BLE001 - keep serving; fail this step's requests
                errors += 1
                reason = f"engine_error: {type(err).__name__}: {err}"
                result = StepResult(duration_s=0.0, failed=[(r, reason) for r, _ in out.prefill]
                                    + [(r, reason) for r in out.decode])
                if errors >= MAX_ENGINE_ERRORS:
                    self.broken = reason
            tokens = self._take_tokens()
            with self.lock:
                now = self.now()
                ended = self.sched.update_from_output(out, result, now)
                ended += self._drain_ended()
                for req in ended:
                    if req.status is not Status.FINISHED:
                        self.engine.forget(req)
                self.num_steps += 1
            for req, _mode in out.preempted:
                self.metrics.preempted(req.tenant)
            self._publish(tokens, ended, threadsafe=True)
            if self.broken is not None:
                self._fail_all(f"failed: engine broken ({self.broken})")

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
                ("tokenfair_engine_steps", "Engine steps executed", (), {(): self.num_steps}),
            ]
        return {"queue": dict(queue), "running": dict(running), "share": share, "entitled": entitled, "extra": extra}


def _deliver(items) -> None:
    for job, item in items:
        job.q.put_nowait(item)


def build_engine_service(model: str, contract: Contract, keyring: KeyRing, *, threads: int = 2,
                         kv_tokens: int | None = None, block_size: int = 16, policy: str = "fair",
                         profile: Profile | None = None, served_model: str | None = None,
                         max_tokens_default: int = 256, records: RecordSink | None = None,
                         seed: int = 0, max_tenant_labels: int = 20) -> EngineBackend:
    """Load ``model`` ("default", a .gguf file or an HF folder) and wrap it in a service."""
    from ..engine.real import make_real_setup

    make_policy(policy)      # fail early on a bad policy name
    num_blocks = None if kv_tokens is None else max(1, kv_tokens // block_size)
    prof, engine = make_real_setup(model, contract, profile, num_blocks=num_blocks, block_size=block_size,
                                   num_threads=threads, seed=seed)
    return EngineBackend(contract, keyring, engine, prof, policy=policy, served_model=served_model,
                         max_tokens_default=max_tokens_default, records=records,
                         max_tenant_labels=max_tenant_labels)

"""``gateway`` mode: the fair policy's layers 1-3 in front of N OpenAI-compatible backends.

    clients -> gateway (auth, contract, FairPolicy queue) --window--> backend 1 (vLLM, serve, ...)
                                                           --window--> backend 2 ...

The gateway keeps every tenant's requests in its own queue and releases them to a backend
only while that backend has room in its *window*; the backends then see a short queue, so
their own (FIFO) order hardly matters and the gateway's order decides who is served next.

Policy.  A ``FairPolicy`` instance (``--policy``, default ``fair``) is driven through its
hooks, without the iteration mechanics (there are no steps, KV blocks or chunks here):

  arrival   ``on_arrival`` (bounded queue -> 429 ``queue_full``; predicted wait over the
            class's max wait -> 429 ``overloaded``), the token-bucket door check
            (429 ``rate_limited``), then ``enqueue``;
  dispatch  while some backend has room: ``pick`` (overdue / below-min-share / least
            virtual finish tag, best request inside the tenant by EDF + aging),
            ``can_admit`` (max_concurrency, token rate, slot reservations; a tenant that
            fails is skipped for this round), ``take`` + ``on_admit`` (charges the
            predicted cost: prompt estimate + predicted output);
  progress  each streamed chunk with text counts as one output token (``on_served``); the
            final ``usage`` (requested with ``stream_options.include_usage``) corrects
            prompt and output counts, so the charge ends at the true cost; ``on_finish``
            refunds an over-prediction;
  time      ``on_step_end(now, elapsed)`` decays the shares on every dispatch round, and the
            policy's per-token time is the backends' observed time per output token, so
            ``expire`` fails a queued request whose deadline can no longer be met (504).

Window (per backend, documented AIMD on time to first token).  A backend that is given
more work than it runs at once queues it internally, which shows up as TTFT far above
what the same prompt length gets on an unloaded backend.  Per prompt-length bucket
(powers of two) the window keeps a baseline TTFT: the lowest observed, forgotten slowly
(it drifts up ``baseline_drift`` per second so old minima expire).  On each first token:

  * TTFT <= ``tolerance`` x baseline + ``slack_s`` ("not queueing") and the window is in
    use (in flight >= window - 1): grow -- by 1 per response in slow start (doubling per
    round trip, until the first decrease), then by 1/window per response (+1 per round);
  * TTFT above that target: shrink to ``beta`` x window (at least ``min``), at most once
    per round trip: requests released before the last decrease do not shrink it again;
  * a 429/503 answer or a connection error: shrink (and retry the request elsewhere).

The contract's ``engine.max_running`` bounds the requests in flight through the gateway in
total (slot reservations, ``min_share x max_running``, apply to that budget): set it to
about the backends' total concurrency.  Optionally ``max_inflight_tokens`` caps the predicted tokens (prompt + predicted output) in
flight per backend.  Backends that refuse connections are marked down and probed
(``GET /v1/models``) with back-off; a request that failed before its first token is
re-queued (at most ``max_retries`` times, kept charged, counted as a preemption).  When
no backend is up, new requests get 503 ``no_backend``.

Responses are re-framed: the gateway always streams from the backend and passes on text
deltas, finish reasons and usage (fields beyond those, e.g. logprobs or tool calls, are
not forwarded).  Authentication: ``backend_key`` if given, else the client's own
``Authorization`` header is forwarded (so a tokenfair ``serve`` backend with the same
contract sees the same tenant); ``x-tokenfair-*`` headers are forwarded, the body's
``tokenfair`` extension is turned into those headers.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from ..contract import Contract
from ..costmodel import Profile
from ..kv import BlockPool
from ..request import Request, Status
from ..sched.predictor import OnlinePredictor
from ..sched.registry import make_policy
from .app import Delta, Done, Failed, GenRequest, Job, RecordSink, Service, failed_event
from .auth import KeyRing

IDLE_POLL_S = 0.05
DEFAULT_MAX_TOKENS = 1024       # the charge's output bound for a request without max_tokens


@dataclass(frozen=True)
class WindowConfig:
    initial: float = 2.0
    min: float = 1.0
    max: float = 256.0
    tolerance: float = 2.0
    slack_s: float = 0.05
    beta: float = 0.7
    baseline_drift: float = 0.01
    max_inflight_tokens: int | None = None


def _bucket(prompt_tokens: int) -> int:
    return max(0, int(prompt_tokens).bit_length() - 6)


class AdaptiveWindow:
    """AIMD concurrency window driven by time to first token (see the module docstring)."""

    def __init__(self, cfg: WindowConfig) -> None:
        self.cfg = cfg
        self.window = float(max(cfg.min, min(cfg.max, cfg.initial)))
        self.baseline: dict[int, tuple[float, float]] = {}     # bucket -> (ttft, when observed)
        self.slow_start = True
        self.last_decrease_s = -math.inf
        self.increases = 0
        self.decreases = 0

    @property
    def limit(self) -> int:
        return max(1, int(self.window))

    def baseline_s(self, prompt_tokens: int, now: float) -> float | None:
        b = self.baseline.get(_bucket(prompt_tokens))
        if b is None:
            return None
        return b[0] * (1.0 + self.cfg.baseline_drift) ** max(0.0, now - b[1])

    def target_s(self, prompt_tokens: int, now: float) -> float | None:
        base = self.baseline_s(prompt_tokens, now)
        return None if base is None else self.cfg.tolerance * base + self.cfg.slack_s

    def on_first_token(self, ttft: float, prompt_tokens: int, released_s: float, inflight: int, now: float) -> None:
        target = self.target_s(prompt_tokens, now)
        base = self.baseline_s(prompt_tokens, now)
        if base is None or ttft < base:
            self.baseline[_bucket(prompt_tokens)] = (ttft, now)
        if target is not None and ttft > target:
            self._decrease(released_s, now)
            return
        if inflight >= self.window - 1:
            self.window = min(self.cfg.max, self.window + (1.0 if self.slow_start else 1.0 / self.window))
            self.increases += 1

    def on_overload(self, released_s: float, now: float) -> None:
        self._decrease(released_s, now)

    def _decrease(self, released_s: float, now: float) -> None:
        if released_s < self.last_decrease_s:
            return                       # released under the old window: already accounted for
        self.slow_start = False
        self.window = max(self.cfg.min, self.window * self.cfg.beta)
        self.last_decrease_s = now
        self.decreases += 1


@dataclass
class Backend:
    url: str                          # base URL ending in /v1
    window: AdaptiveWindow
    name: str = ""
    up: bool = True
    next_probe_s: float = 0.0
    probe_backoff_s: float = 0.5
    inflight: int = 0
    inflight_tokens: int = 0
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    served: int = 0
    errors: int = 0
    models: list[str] = field(default_factory=list)

    def room(self) -> int:
        return self.window.limit - self.inflight


def normalize_backend_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"backend {url!r}: expected an http(s):// URL")
    return u if u.endswith("/v1") else u + "/v1"


def estimate_prompt_tokens(g: GenRequest, chars_per_token: float) -> int:
    """The gateway has no tokenizer: characters / ``chars_per_token`` (+4 per chat message);
    token-id prompts are exact.  The backend's ``usage`` corrects the charge afterwards."""
    body = g.body
    if g.kind == "chat":
        return max(1, sum(4 + math.ceil(len(m.text()) / chars_per_token) for m in body.messages))
    p = body.prompt
    if isinstance(p, str):
        return max(1, math.ceil(len(p) / chars_per_token))
    return max(1, len(p))


class GatewayJob(Job):
    def __init__(self, g: GenRequest, req: Request) -> None:
        super().__init__(g, req)
        self.q: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.backend: Backend | None = None
        self.released_s = 0.0
        self.charge_tokens = 0
        self.retries = 0
        self.cancel_reason: str | None = None
        self.ended = False

    async def next_event(self):
        return await self.q.get()


class Gateway(Service):
    mode = "gateway"

    def __init__(self, contract: Contract, keyring: KeyRing, backends: list[str], *, policy: str = "fair",
                 backend_key: str | None = None, window: WindowConfig | None = None,
                 max_context: int | None = None, records: RecordSink | None = None,
                 max_tenant_labels: int = 20, request_timeout_s: float = 600.0,
                 connect_timeout_s: float = 5.0, max_retries: int = 2, chars_per_token: float = 4.0,
                 max_tokens_default: int = DEFAULT_MAX_TOKENS) -> None:
        super().__init__(contract, keyring, records=records, max_tenant_labels=max_tenant_labels)
        if not backends:
            raise ValueError("gateway: give at least one --backend URL")
        self.window_cfg = window or WindowConfig()
        self.backends = [Backend(normalize_backend_url(u), AdaptiveWindow(self.window_cfg)) for u in backends]
        for b in self.backends:
            b.name = b.url.split("://", 1)[1].removesuffix("/v1")
        self.policy = make_policy(policy)
        self.policy_name = policy
        # No KV, no steps: the profile only feeds the policy's service-time estimates.
        self.profile = Profile(name="gateway", kind="linear", prefill_batch_s=0.01, prefill_token_s=2e-4,
                               decode_base_s=0.02, overhead_s=0.0, kv_capacity_tokens=1 << 40, block_size=16)
        self.pool = BlockPool(self.profile.num_blocks, self.profile.block_size)
        self.predictor = OnlinePredictor()
        self.policy.bind(contract, self.profile, self.pool, self.predictor)
        self.backend_key = backend_key
        self.max_context = max_context
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.chars_per_token = chars_per_token
        self.max_tokens_default = max_tokens_default
        self.jobs: dict[str, GatewayJob] = {}
        self.running: set[GatewayJob] = set()
        self.client: httpx.AsyncClient | None = None
        self.wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._last_round_s = 0.0
        self._sleep = IDLE_POLL_S
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.wake = asyncio.Event()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout_s, connect=self.connect_timeout_s),
                                        limits=limits)
        await asyncio.gather(*(self._probe(b) for b in self.backends))
        self._last_round_s = self.now()
        self._tasks = [asyncio.ensure_future(self._dispatch_loop()), asyncio.ensure_future(self._probe_loop())]

    def model_names(self) -> list[str]:
        names: list[str] = []
        for b in self.backends:
            for m in b.models:
                if m not in names:
                    names.append(m)
        return names

    def health(self) -> tuple[bool, dict]:
        up = [b.name for b in self.backends if b.up]
        ok = bool(up) and not self.closing
        return ok, {"mode": self.mode, "closing": self.closing, "backends_up": up,
                    "backends_down": [b.name for b in self.backends if not b.up],
                    "waiting": self.policy.num_waiting(), "running": len(self.running)}

    async def drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + max(0.0, grace_s)
        while self.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for job in list(self.jobs.values()):
            self._abort(job, "shutdown: the gateway is stopping (grace period over)")
        end = time.monotonic() + 5.0
        while self.jobs and time.monotonic() < end:
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.aclose()
        await super().stop()

    # ------------------------------------------------------------------ intake
    def submit(self, g: GenRequest) -> GatewayJob:
        now = self.now()
        est = estimate_prompt_tokens(g, self.chars_per_token)
        asked = g.body.requested_max_tokens()
        max_tokens = asked if asked is not None else self.max_tokens_default
        if self.max_context is not None:
            if est >= self.max_context:
                req = self.intake(g, est, 1, now)
                raise self.refuse(req, f"context_length_exceeded: the prompt has ~{est} tokens; the backends' "
                                       f"context holds {self.max_context} tokens", now, endpoint=g.kind)
            max_tokens = min(max_tokens, self.max_context - est)
        req = self.intake(g, est, max_tokens, now)
        if self.closing:
            raise self.refuse(req, "shutting_down: the gateway is stopping", now, endpoint=g.kind)
        if not any(b.up for b in self.backends):
            raise self.refuse(req, f"no_backend: all {len(self.backends)} backends are down", now,
                              retry_after=1.0, endpoint=g.kind)
        door = self.door_check(req, now)
        if door is not None:
            raise self.refuse(req, door[0], now, retry_after=door[1], endpoint=g.kind)
        req.predicted_output = self.predictor.predict(req)
        reason = self.policy.on_arrival(req, now)
        if reason is not None:
            raise self.refuse(req, reason, now, endpoint=g.kind)
        req.status = Status.WAITING
        self.policy.enqueue(req, now)
        job = GatewayJob(g, req)
        job.model = g.model or ""
        self.jobs[req.request_id] = job
        self.wake.set()
        return job

    def cancel(self, job: Job, reason: str = "client_disconnected: the client closed the connection") -> None:
        self._abort(job, reason)

    def _abort(self, job: GatewayJob, reason: str) -> None:
        req = job.req
        if job.ended or req.status.is_terminal:
            return
        if req.status is Status.RUNNING and job.task is not None and not job.task.done():
            job.cancel_reason = reason
            job.task.cancel()
            return
        if req.status is Status.WAITING:
            self.policy.discard(req)
        self._end(job, Status.FAILED, reason)

    def _end(self, job: GatewayJob, status: Status, reason: str, event=None, http_status: int | None = None,
             finish_reason: str | None = None) -> None:
        if job.ended:
            return
        job.ended = True
        req = job.req
        now = self.now()
        req.status, req.reason, req.finish_s = status, reason, now
        if status is Status.FINISHED:
            self.predictor.observe(req, req.num_output)
            self.policy.on_finish(req, now)
        elif req.scheduled_s is not None:
            self.policy.on_finish(req, now)
        self.jobs.pop(req.request_id, None)
        extra = {} if http_status is None else {"http_status": http_status}
        self.record(req, endpoint=job.g.kind, finish_reason=finish_reason, **extra)
        job.q.put_nowait(event if event is not None else failed_event(req))
        job.finished.set()
        if self.wake is not None:
            self.wake.set()

    # ------------------------------------------------------------------ dispatch
    async def _dispatch_loop(self) -> None:
        while not self._stopped:
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=self._sleep)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            try:
                self._dispatch_round()
            except Exception as err:  # noqa: BLE001 - a policy bug must not stop the gateway
                import logging
                logging.getLogger("tokenfair.gateway").exception("dispatch round failed: %s", err)
                await asyncio.sleep(IDLE_POLL_S)

    def _tpot_estimate(self) -> float | None:
        vals = [b.tpot_ewma_s for b in self.backends if b.tpot_ewma_s is not None]
        return sum(vals) / len(vals) if vals else None

    def _free_backend(self, tokens: int) -> Backend | None:
        best, best_key = None, None
        cap = self.window_cfg.max_inflight_tokens
        for b in self.backends:
            if not b.up or b.room() <= 0:
                continue
            if cap is not None and b.inflight > 0 and b.inflight_tokens + tokens > cap:
                continue
            key = (-b.room() / b.window.limit, b.ttft_ewma_s or 0.0)
            if best_key is None or key < best_key:
                best, best_key = b, key
        return best

    def _dispatch_round(self) -> None:
        policy = self.policy
        now = self.now()
        elapsed = now - self._last_round_s
        if elapsed > 0:
            policy.on_step_end(now, elapsed)
            self._last_round_s = now
        tpot = self._tpot_estimate()
        if tpot is not None and hasattr(policy, "step_ewma_s"):
            policy.step_ewma_s = tpot
        for req, reason in policy.expire(now):
            job = self.jobs.get(req.request_id)
            if job is not None:
                self._end(job, Status.EXPIRED, reason)
        blocked: set[str] = set()
        max_running = self.contract.engine.max_running
        while policy.num_waiting() and len(self.running) < max_running:
            if self._free_backend(0) is None:
                break
            cand = policy.pick(now, blocked)
            if cand is None:
                break
            tokens = cand.prompt_tokens + cand.predicted_remaining
            b = self._free_backend(tokens)
            if b is None:
                break
            if not policy.can_admit(cand, now, len(self.running)):
                if policy.hol_blocking:
                    break
                blocked.add(cand.tenant)
                continue
            policy.take(cand)
            cand.status = Status.RUNNING
            if cand.scheduled_s is None:
                cand.scheduled_s = now
            policy.on_admit(cand, now)
            job = self.jobs[cand.request_id]
            job.backend = b
            job.released_s = now
            job.charge_tokens = tokens
            b.inflight += 1
            b.inflight_tokens += tokens
            self.running.add(job)
            job.task = asyncio.ensure_future(self._proxy(job, b))
            job.task.add_done_callback(lambda t, job=job, b=b, n=tokens: self._proxy_done(job, b, n, t))
        wake = policy.next_wakeup(now)
        self._sleep = IDLE_POLL_S if policy.num_waiting() else 1.0
        if wake < math.inf:
            self._sleep = min(self._sleep, max(0.001, wake - now))

    # ------------------------------------------------------------------ backend calls
    def _headers(self, job: GatewayJob) -> dict[str, str]:
        h = {k: v for k, v in job.g.forward_headers.items() if k.lower().startswith("x-tokenfair-")}
        if self.backend_key is not None:
            h["authorization"] = f"Bearer {self.backend_key}"
        else:
            for k, v in job.g.forward_headers.items():
                if k.lower() in ("authorization", "x-api-key"):
                    h[k.lower()] = v
        g = job.g
        if g.klass and "x-tokenfair-class" not in h:
            h["x-tokenfair-class"] = g.klass
        if g.deadline_s is not None and "x-tokenfair-deadline-s" not in h:
            h["x-tokenfair-deadline-s"] = repr(g.deadline_s)
        if g.priority is not None and "x-tokenfair-priority" not in h:
            h["x-tokenfair-priority"] = repr(g.priority)
        return h

    def _body(self, job: GatewayJob, b: Backend) -> dict:
        body = {k: v for k, v in job.g.raw.items() if k != "tokenfair"}
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if not body.get("model") and b.models:
            body["model"] = b.models[0]
        return body

    def _requeue_or_fail(self, job: GatewayJob, b: Backend, reason: str, status: int) -> None:
        req = job.req
        now = self.now()
        if job.retries < self.max_retries and not self.closing and req.num_output == 0:
            job.retries += 1
            self.running.discard(job)
            req.num_preemptions += 1
            req.last_preempt_s = now
            req.status = Status.WAITING
            self.policy.enqueue(req, now)
            self.metrics.preempted(req.tenant)
            return
        self._end(job, Status.FAILED, reason,
                  Failed(status, f"request failed: {reason}", reason.split(":", 1)[0]), http_status=status)

    async def _proxy(self, job: GatewayJob, b: Backend) -> None:
        req, g = job.req, job.g
        path = "/chat/completions" if g.kind == "chat" else "/completions"
        chat = g.kind == "chat"
        finish_reason = None
        usage = None
        prompt_est = req.prompt_tokens
        try:
            async with self.client.stream("POST", b.url + path, json=self._body(job, b),
                                          headers=self._headers(job)) as resp:
                if resp.status_code != 200:
                    await self._backend_refused(job, b, resp)
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        continue
                    if "error" in chunk:
                        err = chunk["error"] or {}
                        msg = err.get("message", "error") if isinstance(err, dict) else str(err)
                        raise _StreamError(f"backend_error: {b.name}: {msg}")
                    m = chunk.get("model")
                    if m:
                        if not job.model:
                            job.model = m
                        if m not in b.models:
                            b.models.append(m)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for c in chunk.get("choices") or []:
                        text = (c.get("delta") or {}).get("content") if chat else c.get("text")
                        if text:
                            self._on_token(job, b, text)
                        if c.get("finish_reason"):
                            finish_reason = c["finish_reason"]
            self._on_complete(job, b, usage, finish_reason, prompt_est)
        except (httpx.ConnectError, httpx.ConnectTimeout) as err:
            self._mark_down(b, f"{type(err).__name__}")
            b.window.on_overload(job.released_s, self.now())
            self._requeue_or_fail(job, b, f"backend_unavailable: {b.name}: {type(err).__name__}", 503)
        except (_StreamError, httpx.HTTPError) as err:
            b.errors += 1
            reason = str(err) if isinstance(err, _StreamError) else f"backend_error: {b.name}: {type(err).__name__}: {err}"
            if req.num_output == 0:
                self._requeue_or_fail(job, b, reason, 502)
            else:
                self._end(job, Status.FAILED, reason, Failed(502, f"request failed: {reason}", "backend_error"),
                          http_status=502)

    def _proxy_done(self, job: GatewayJob, b: Backend, tokens: int, task: asyncio.Task) -> None:
        """Always runs, even for a task cancelled before it started: release the window slot
        and end a job the task did not end (cancelled: client gone or shutdown; crashed).
        A job re-queued by this task and already released again belongs to its new task."""
        b.inflight -= 1
        b.inflight_tokens -= tokens
        if job.task is not task:
            if self.wake is not None:
                self.wake.set()
            return
        self.running.discard(job)
        if not job.ended and job.req.status is Status.RUNNING:
            if task.cancelled():
                self._end(job, Status.FAILED, job.cancel_reason or "shutdown: the gateway is stopping")
            else:
                err = task.exception()
                reason = f"gateway_error: {type(err).__name__}: {err}" if err else "gateway_error: proxy ended early"
                self._end(job, Status.FAILED, reason, Failed(500, reason, "gateway_error"), http_status=500)
        if self.wake is not None:
            self.wake.set()

    async def _backend_refused(self, job: GatewayJob, b: Backend, resp: httpx.Response) -> None:
        raw = await resp.aread()
        try:
            err = json.loads(raw).get("error") or {}
            msg = err.get("message") if isinstance(err, dict) else str(err)
        except (json.JSONDecodeError, AttributeError):
            msg = raw[:200].decode(errors="replace")
        status = resp.status_code
        reason = f"backend_status: {b.name} answered {status}: {msg}"
        if status in (429, 503):
            b.window.on_overload(job.released_s, self.now())
            self._requeue_or_fail(job, b, reason, status)
        elif status >= 500:
            b.errors += 1
            self._requeue_or_fail(job, b, reason, 502)
        else:
            self._end(job, Status.FAILED, reason, Failed(status, msg or reason, "backend_status"), http_status=status)

    def _on_token(self, job: GatewayJob, b: Backend, text: str) -> None:
        req = job.req
        now = self.now()
        if req.first_token_s is None:
            req.first_token_s = now
            ttft = now - job.released_s
            b.ttft_ewma_s = ttft if b.ttft_ewma_s is None else b.ttft_ewma_s + 0.1 * (ttft - b.ttft_ewma_s)
            b.window.on_first_token(ttft, req.prompt_tokens, job.released_s, b.inflight, now)
            req.num_computed = req.prompt_tokens + 1
            req.num_output = 1
            self.policy.on_served(req, req.prompt_tokens, 1, now)
            self.wake.set()          # the window may have grown
        else:
            req.num_output += 1
            req.num_computed += 1
            self.policy.on_served(req, 0, 1, now)
        job.q.put_nowait(Delta(text, 1))

    def _on_complete(self, job: GatewayJob, b: Backend, usage, finish_reason, prompt_est: int) -> None:
        req = job.req
        now = self.now()
        if usage:
            p = int(usage.get("prompt_tokens") or req.prompt_tokens)
            n = int(usage.get("completion_tokens") or req.num_output)
            extra_prompt = max(0, p - req.prompt_tokens) if req.num_output else p
            extra_out = max(0, n - req.num_output)
            req.prompt_tokens = p
            if n > 0 and req.first_token_s is None:
                req.first_token_s = now
            req.num_output = n
            req.num_computed = p + n
            if extra_prompt or extra_out:
                self.policy.on_served(req, extra_prompt, extra_out, now)
        if req.first_token_s is not None and req.num_output > 1:
            tpot = (now - req.first_token_s) / (req.num_output - 1)
            b.tpot_ewma_s = tpot if b.tpot_ewma_s is None else b.tpot_ewma_s + 0.1 * (tpot - b.tpot_ewma_s)
        b.served += 1
        fr = finish_reason or ("length" if req.num_output >= req.max_tokens else "stop")
        self._end(job, Status.FINISHED, f"backend_{fr}",
                  Done(fr, req.prompt_tokens, req.num_output), finish_reason=fr)

    # ------------------------------------------------------------------ health
    def _mark_down(self, b: Backend, why: str) -> None:
        if b.up:
            b.up = False
            b.probe_backoff_s = 0.5
        b.next_probe_s = self.now() + b.probe_backoff_s

    async def _probe(self, b: Backend) -> bool:
        headers = {"authorization": f"Bearer {self.backend_key}"} if self.backend_key else {}
        try:
            r = await self.client.get(b.url + "/models", headers=headers, timeout=2.0)
        except httpx.HTTPError:
            self._mark_down(b, "probe failed")
            b.probe_backoff_s = min(5.0, b.probe_backoff_s * 2)
            return False
        if r.status_code >= 500:
            self._mark_down(b, f"probe {r.status_code}")
            return False
        if r.status_code == 200:
            try:
                b.models = [m["id"] for m in r.json().get("data", []) if "id" in m]
            except (ValueError, AttributeError, TypeError, KeyError):
                pass
        if not b.up:
            b.up = True
            if self.wake is not None:
                self.wake.set()
        return True

    async def _probe_loop(self) -> None:
        while not self._stopped:
            await asyncio.sleep(0.25)
            now = self.now()
            down = [b for b in self.backends if not b.up and now >= b.next_probe_s]
            if down:
                await asyncio.gather(*(self._probe(b) for b in down))

    # ------------------------------------------------------------------ metrics
    def snapshot(self) -> dict:
        now = self.now()
        queue: Counter = Counter()
        for job in list(self.jobs.values()):
            if job.req.status is Status.WAITING:
                queue[(job.req.tenant, job.req.klass)] += 1
        running = Counter(j.req.tenant for j in self.running)
        share, entitled = self.share_snapshot(now)
        per = lambda f: {(b.name,): float(f(b)) for b in self.backends}  # noqa: E731
        extra = [
            ("tokenfair_backend_window", "Adaptive concurrency window per backend", ("backend",), per(lambda b: b.window.window)),
            ("tokenfair_backend_inflight", "Requests in flight per backend", ("backend",), per(lambda b: b.inflight)),
            ("tokenfair_backend_up", "1 if the backend is taking work", ("backend",), per(lambda b: b.up)),
            ("tokenfair_backend_ttft_ewma_seconds", "Smoothed TTFT per backend", ("backend",),
             per(lambda b: b.ttft_ewma_s or 0.0)),
        ]
        return {"queue": dict(queue), "running": dict(running), "share": share, "entitled": entitled, "extra": extra}


class _StreamError(Exception):
    pass

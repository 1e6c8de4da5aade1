"""``gateway`` mode: the fair policy's layers 1-3 in front of N OpenAI-compatible backends.

    clients -> gateway (auth, contract, FairPolicy queue) --window--> backend 1 (vLLM, serve, ...)
                                                           --window--> backend 2 ...

The gateway keeps every tenant's requests in its own queue and releases them to a backend
only while that backend has room in its *window*; the backends then see a short queue, so
their own (FIFO) order hardly matters and the gateway's order decides who is served next.

Policy.  A ``FairPolicy`` instance (``--policy``, default ``fair``) is driven through its
hooks, without the iteration mechanics (there are no steps, KV blocks or chunks here):

  arrival   the token-bucket door check (429 ``rate_limited``), then the scheduler's own
            arrival (``sched/arrival.arrive``): ``on_arrival`` (bounded queue -> 429
            ``queue_full``; predicted wait over the class's max wait -> 429 ``overloaded``),
            then ``enqueue``;
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

Window (per backend): driven by the backend's saturation when it exports vLLM's metrics
(:mod:`tokenfair.serve.saturation`), else AIMD on time to first token
(:mod:`tokenfair.serve.gateway_window`).  Every body sent carries the authenticated tenant
and class in ``vllm_xargs`` (:mod:`tokenfair.serve.backend_identity`).

The contract's ``engine.max_running`` bounds the requests in flight through the gateway in
total (slot reservations, ``min_share x max_running``, apply to that budget): set it to
about the backends' total concurrency.  Optionally ``max_inflight_tokens`` caps the predicted tokens (prompt + predicted output) in
flight per backend.  Backends are probed (``GET /v1/models``, with the backend key) while up
and while down (:mod:`tokenfair.serve.gateway_health`: timeouts, probes, draining of a
backend that stops answering); a request that failed before its first token is
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
import math
import time
from collections import Counter

import httpx

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.request import Status
from ..sched.arrival import arrive
from ..sched.predictor import OnlinePredictor
from ..sched.registry import make_policy
from .jobs import GenRequest, Job, RecordSink, failed_event
from .service import Service
from .auth import KeyRing
from .gateway_backend import BackendClient, GatewayJob
from .gateway_dispatch import IDLE_POLL_S, Dispatcher
from .gateway_context import context_refusal
from .gateway_errors import scrub
from .gateway_health import BackendHealth, HealthConfig, ProbeState
from .jobs import Failed
from .gateway_window import AdaptiveWindow, Backend, WindowConfig, normalize_backend_url
from .saturation import SaturationConfig, late_first_tokens, make_window, poll_saturation

# Split into gateway_window (AIMD window, backend state), gateway_backend (proxy, probes)
# and gateway_dispatch (dispatch loop); the public names stay importable from here.
__all__ = [
    "IDLE_POLL_S", "DEFAULT_MAX_TOKENS", "WindowConfig", "AdaptiveWindow", "Backend", "normalize_backend_url",
    "estimate_prompt_tokens", "GatewayJob", "Gateway",
]

DEFAULT_MAX_TOKENS = 1024       # the charge's output bound for a request without max_tokens


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


class Gateway(Dispatcher, BackendHealth, BackendClient, Service):
    mode = "gateway"

    def __init__(self, contract: Contract, keyring: KeyRing, backends: list[str], *, policy: str = "fair",
                 backend_key: str | None = None, window: WindowConfig | None = None,
                 max_context: int | None = None, records: RecordSink | None = None,
                 max_tenant_labels: int = 20, request_timeout_s: float = 600.0,
                 health: HealthConfig | None = None, max_retries: int = 2, chars_per_token: float = 4.0,
                 max_tokens_default: int = DEFAULT_MAX_TOKENS, backend_priority: bool = False,
                 saturation: SaturationConfig | None = SaturationConfig()) -> None:
        super().__init__(contract, keyring, records=records, max_tenant_labels=max_tenant_labels)
        if not backends:
            raise ValueError("gateway: give at least one --backend URL")
        self.window_cfg = window or WindowConfig()
        self.backends = [Backend(normalize_backend_url(u), make_window(self.window_cfg, saturation))
                         for u in backends]
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
        self.backend_priority = backend_priority    # send vLLM `priority` (backend_identity.py)
        self.max_context = max_context
        self.request_timeout_s = request_timeout_s
        self.health_cfg = health or HealthConfig()
        self.probe_states = {b.url: ProbeState() for b in self.backends}
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
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout_s,
                                                              connect=self.health_cfg.connect_timeout_s),
                                        limits=limits)
        await self._first_probes()
        self._last_round_s = self.now()
        self._tasks = [asyncio.ensure_future(self._dispatch_loop()), asyncio.ensure_future(self._probe_loop())]
        key = {"authorization": f"Bearer {self.backend_key}"} if self.backend_key else {}
        self._tasks.append(asyncio.ensure_future(poll_saturation(
            self.backends, self.client, self.now, lambda: self._stopped, self.wake.set, key, self._starting_on)))

    def _starting_on(self, b: Backend) -> int:
        """Requests released to ``b`` still without a first token past the TTFT the window
        expects for their prompt (queued behind other prompts there; saturation.py)."""
        return late_first_tokens(b, [j for j in self.running if j.backend is b], self.now())

    def prompt_bounds(self) -> tuple[int | None, int | None]:
        return self.max_context, None           # no tokenizer: only the certain bounds (body_precheck)

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
        est = max(estimate_prompt_tokens(g, self.chars_per_token), g.min_prompt_tokens)
        asked = g.body.requested_max_tokens()
        max_tokens = asked if asked is not None else self.max_tokens_default
        if self.max_context is not None:           # gateway_context.py: refused only when certain
            refusal = context_refusal(g, est, asked, self.max_context)
            if refusal is not None:
                req = self.intake(g, est, 1, now)
                raise self.refuse(req, refusal[0], now, endpoint=g.kind, param=refusal[1])
            if asked is None:                      # the charge's bound for a request without one
                max_tokens = max(1, min(max_tokens, self.max_context - est))
        req = self.intake(g, est, max_tokens, now)
        if self.closing:
            raise self.refuse(req, "shutting_down: the gateway is stopping", now, endpoint=g.kind)
        if not any(b.up for b in self.backends):
            raise self.refuse(req, f"no_backend: all {len(self.backends)} backends are down", now,
                              retry_after=1.0, endpoint=g.kind)
        door = self.door_check(req, now)
        if door is not None:
            raise self.refuse(req, door[0], now, retry_after=door[1], endpoint=g.kind)
        reason = arrive(self.policy, self.predictor, req, now)
        if reason is not None:
            raise self.refuse(req, reason, now, endpoint=g.kind)
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
        event = event if event is not None else failed_event(req)
        if isinstance(event, Failed):     # the client never sees the backends' addresses
            event.message = scrub(event.message, self.backends)
        job.q.put_nowait(event)
        job.finished.set()
        if self.wake is not None:
            self.wake.set()

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

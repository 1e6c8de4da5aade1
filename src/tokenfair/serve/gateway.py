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

Parts (each built with its own state and narrow callbacks, each testable alone)::

    Gateway (Service: intake, door, records, metrics)
      .book        JobBook         held jobs, running set, the one terminal state per job,
                                   re-queue after a failed attempt     (gateway_jobs.py)
      .prober      HealthProber    probes, up/down, drain of a dead backend (gateway_health.py)
      .proxy       BackendProxy    one released request streamed from a backend (gateway_backend.py)
      .dispatcher  Dispatcher      the dispatch loop and rounds        (gateway_dispatch.py)
      .backends    [Backend]       per-backend state and window        (gateway_window.py, saturation.py)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.reasons import CLIENT_CLOSED, Reason, ReasonCode
from ..core.request import Status
from ..sched.arrival import arrive
from ..sched.predictor import OnlinePredictor
from ..sched.registry import make_policy
from .jobs import GenRequest, Job, RecordSink
from .service import Service
from .auth import KeyRing
from .gateway_backend import BackendProxy
from .gateway_dispatch import IDLE_POLL_S, Dispatcher
from .gateway_context import context_refusal, estimate_tokens
from .gateway_health import HealthConfig, HealthProber
from .gateway_jobs import GatewayJob, JobBook
from .gateway_window import AdaptiveWindow, Backend, WindowConfig, normalize_backend_url
from .saturation import SaturationConfig, late_first_tokens, make_window, poll_saturation

# The parts live in gateway_jobs, gateway_health, gateway_backend, gateway_dispatch and
# gateway_window; the public names stay importable from here.
__all__ = [
    "IDLE_POLL_S", "DEFAULT_MAX_TOKENS", "WindowConfig", "AdaptiveWindow", "Backend", "normalize_backend_url",
    "estimate_prompt_tokens", "GatewayJob", "Gateway",
]

DEFAULT_MAX_TOKENS = 1024       # the charge's output bound for a request without max_tokens
SHUTDOWN_POLL_S = 0.02          # drain: how often to look whether the held jobs have ended
ABORT_WAIT_S = 5.0              # drain: how long aborted jobs may take to end after the grace period


def estimate_prompt_tokens(g: GenRequest, chars_per_token: float) -> int:
    """The gateway has no tokenizer: characters / ``chars_per_token`` (+4 per chat message);
    token-id prompts are exact (a big body's, from the helper process: kept_prompt.py).
    The backend's ``usage`` corrects the charge afterwards."""
    if g.kept_prompt is not None:
        return g.kept_prompt.est_tokens
    return estimate_tokens(g.kind, g.body, chars_per_token)


class Gateway(Service):
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
        window_cfg = window or WindowConfig()
        self.backends = [Backend(normalize_backend_url(u), make_window(window_cfg, saturation)) for u in backends]
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
        self.health_cfg = health or HealthConfig()
        self.chars_per_token = chars_per_token
        self.max_tokens_default = max_tokens_default
        self.client: httpx.AsyncClient | None = None
        self.wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.book = JobBook(self.policy, self.predictor, self.backends, max_retries=max_retries, now=self.now,
                            record=self.record, preempted=self.metrics.preempted, closing=lambda: self.closing,
                            wake=self._wake)
        self.jobs, self.running = self.book.jobs, self.book.running
        self.prober = HealthProber(self.backends, self.health_cfg, backend_key, now=self.now, wake=self._wake,
                                   drain=self.book.drain_backend)
        self.proxy = BackendProxy(self.health_cfg, backend_key=backend_key, backend_priority=backend_priority,
                                  now=self.now, on_served=self.policy.on_served, wake=self._wake,
                                  endings=self.book, signals=self.prober)
        self.dispatcher = Dispatcher(self.policy, self.backends, self.book,
                                     max_inflight_tokens=window_cfg.max_inflight_tokens,
                                     max_running=lambda: self.contract.engine.max_running, now=self.now,
                                     launch=lambda job, b: self.proxy.run(self.client, job, b),
                                     on_done=self._proxy_done)

    def _wake(self) -> None:
        if self.wake is not None:
            self.wake.set()

    async def _round(self) -> None:
        """One dispatch round (a fleet gateway's round awaits its store: fleet/gateway.py)."""
        self.dispatcher.dispatch_round()

    def _proxy_done(self, job: GatewayJob, b: Backend, tokens: int, task: asyncio.Task) -> None:
        """A proxy task ended (a fleet gateway also gives its lease back: fleet/gateway.py)."""
        self.book.proxy_done(job, b, tokens, task)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.wake = asyncio.Event()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout_s,
                                                              connect=self.health_cfg.connect_timeout_s),
                                        limits=limits)
        await self.prober.first_probes(self.client)
        self.dispatcher.last_round_s = self.now()
        stopped = lambda: self._stopped  # noqa: E731
        self._tasks = [asyncio.ensure_future(self.dispatcher.run(self.wake, self._round, stopped)),
                       asyncio.ensure_future(self.prober.run(self.client, stopped))]
        key = {"authorization": f"Bearer {self.backend_key}"} if self.backend_key else {}
        self._tasks.append(asyncio.ensure_future(poll_saturation(
            self.backends, self.client, self.now, stopped, self.wake.set, key, self._starting_on)))

    def _starting_on(self, b: Backend) -> int:
        """Requests released to ``b`` still without a first token past the TTFT the window
        expects for their prompt (queued behind other prompts there; saturation.py)."""
        return late_first_tokens(b, [j for j in self.running if j.backend is b], self.now())

    def prompt_bounds(self) -> tuple[int | None, int | None]:
        return self.max_context, None           # no tokenizer: only the certain bounds (body_precheck)

    def kept_prompt_chars_per_token(self) -> float | None:
        return self.chars_per_token             # a big body's prompt is forwarded as bytes (kept_prompt.py)

    def model_names(self) -> list[str]:
        return self.prober.model_names()

    async def list_models(self, headers) -> list[str]:
        return await self.prober.list_models(self.client, headers)

    def health(self) -> tuple[bool, dict]:
        up = [b.name for b in self.backends if b.up]
        ok = bool(up) and not self.closing
        return ok, {"mode": self.mode, "closing": self.closing, "backends_up": up,
                    "backends_down": [b.name for b in self.backends if not b.up],
                    "waiting": self.policy.num_waiting(), "running": len(self.running)}

    async def drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + max(0.0, grace_s)
        while self.jobs and time.monotonic() < deadline:
            await asyncio.sleep(SHUTDOWN_POLL_S)
        for job in list(self.jobs.values()):
            self.book.abort(job, Reason(ReasonCode.SHUTDOWN, "the gateway is stopping (grace period over)"))
        end = time.monotonic() + ABORT_WAIT_S
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
            raise self.refuse(req, Reason(ReasonCode.SHUTTING_DOWN, "the gateway is stopping"), now, endpoint=g.kind)
        if not any(b.up for b in self.backends):
            raise self.refuse(req, Reason(ReasonCode.NO_BACKEND, f"all {len(self.backends)} backends are down"), now,
                              retry_after=1.0, endpoint=g.kind)
        door = self.door_check(req, now)
        if door is not None:
            raise self.refuse(req, door[0], now, retry_after=door[1], endpoint=g.kind)
        reason = arrive(self.policy, self.predictor, req, now)
        if reason is not None:
            raise self.refuse(req, reason, now, endpoint=g.kind)
        job = GatewayJob(g, req)
        job.model = g.model or ""
        self.book.add(job)
        self.wake.set()
        return job

    def cancel(self, job: Job, reason: Reason = CLIENT_CLOSED) -> None:
        self.book.abort(job, reason)

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

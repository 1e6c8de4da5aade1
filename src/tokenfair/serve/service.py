"""The :class:`Service` base class shared by ``serve`` (engine) and ``gateway`` (proxy) modes:
contract intake, door checks, rate-limit headers, terminal records, metrics, shutdown state."""

from __future__ import annotations

import itertools
import math
import time
from contextlib import nullcontext
from typing import Any

from ..contracts.contract import Contract
from ..runtime.intake import make_request
from ..evaluation.metrics import entitled_shares, request_record
from ..core.reasons import CLIENT_CLOSED, Reason, ReasonCode
from ..core.request import Request, Status
from ..sched.policy import Policy
from ..workloads.workload import TraceRow
from .auth import KeyRing
from .body_precheck import BodyPrechecker
from .errors import ServiceError, http_status_of, retry_hint_s
from .jobs import GenRequest, Job, RecordSink
from .defaults import DEFAULT_MAX_BODY_BYTES
from .metrics import ServiceMetrics


class Service:
    """What both modes share: contract intake, door checks, records, metrics, shutdown state.

    Subclasses implement ``submit``, ``cancel``, ``start``, ``stop``, ``drain``,
    ``model_names``, ``health`` and ``snapshot``; they own ``policy`` (a scheduling policy
    bound to the contract) and ``policy_lock`` (held while touching it from the HTTP side)."""

    mode = "base"
    max_body_bytes = DEFAULT_MAX_BODY_BYTES   # request bodies above this are refused (413)
    metrics_key_sha256: str | None = None     # set: GET /metrics needs the key with this digest

    def __init__(self, contract: Contract, keyring: KeyRing, *, records: RecordSink | None = None,
                 max_tenant_labels: int = 20) -> None:
        self.contract = contract
        self.keyring = keyring
        self.records = records or RecordSink()
        self.metrics = ServiceMetrics(contract, max_tenant_labels, self.snapshot)
        self._t0 = time.perf_counter()
        self._seq = itertools.count()
        self.closing = False
        self.policy: Policy | None = None                   # bound to the contract by the mode
        self.policy_lock: Any = nullcontext()
        self.admitted_by: dict[str, tuple[str, str]] = {}   # request id -> (version, hash) at intake
        self.live: Any = None                              # serve/contract_live.LiveContract
        self.prechecker = BodyPrechecker()                 # big bodies, parsed in a helper process

    # -- clock & ids
    def now(self) -> float:
        return time.perf_counter() - self._t0

    def next_seq(self) -> int:
        return next(self._seq)

    # -- contract intake
    def intake(self, g: GenRequest, prompt_tokens: int, max_tokens: int, now: float) -> Request:
        """The scheduler request for ``g`` (class, priority, deadline from the contract)."""
        row = TraceRow(request_id=g.request_id, arrival_s=now, tenant=g.tenant, prompt_tokens=max(1, prompt_tokens),
                       output_tokens=1, klass=g.klass, deadline_s=g.deadline_s, priority=g.priority,
                       max_tokens=max_tokens)
        req, reject = make_request(row, self.next_seq(), self.contract)
        self.admitted_by[req.request_id] = (self.contract.version, self.contract.content_hash)
        if reject is not None:
            raise self.refuse(req, reject, now, endpoint=g.kind)
        return req

    def refuse(self, req: Request, reason: Reason | None, now: float, retry_after: float | None = None,
               endpoint: str | None = None, param: str | None = None) -> ServiceError:
        """End ``req`` as REJECTED with ``reason`` (recorded once) and build its HTTP error
        (``reason`` None: ``req`` already ended, with its own)."""
        if not req.status.is_terminal:
            assert reason is not None, "a request refused at the door needs a reason"
            req.status, req.end_reason, req.finish_s = Status.REJECTED, reason, now
        self.metrics.rejected(req.tenant, req.reason_code)
        self.record(req, endpoint=endpoint)
        return self.rejection_error(req, retry_after, param)

    def rejection_error(self, req: Request, retry_after: float | None = None,
                        param: str | None = None) -> ServiceError:
        status = http_status_of(req)
        code = req.reason_code
        headers: dict[str, str] = {}
        if status == 429:
            headers = self.ratelimit_headers(req.tenant, retry_after if retry_after is not None
                                             else retry_hint_s(req.reason))
        elif status == 503:
            headers = {"retry-after": str(max(1, math.ceil(retry_after or 1)))}
        return ServiceError(status, req.reason, code, param, headers=headers)

    def ratelimit_headers(self, tenant: str, retry_after: float) -> dict[str, str]:
        """``Retry-After`` and ``x-ratelimit-*``: requests = the tenant's queue (max_queued),
        tokens = its token bucket in cost units (only when the contract gives it a rate limit)."""
        spec = self.contract.tenant(tenant)
        retry = max(1, math.ceil(retry_after))
        with self.policy_lock:
            view = self.policy.tenant_view(tenant, self.now()) if self.policy is not None else None
        waiting = view.num_waiting if view is not None else 0
        bucket = view.bucket if view is not None else None
        h = {"retry-after": str(retry),
             "x-ratelimit-limit-requests": str(spec.max_queued),
             "x-ratelimit-remaining-requests": str(max(0, spec.max_queued - waiting)),
             "x-ratelimit-reset-requests": f"{retry}s"}
        rl = spec.rate_limit
        if rl is not None:
            b = rl.burst_tokens if bucket is None else bucket
            h["x-ratelimit-limit-tokens"] = str(int(rl.burst_tokens))
            h["x-ratelimit-remaining-tokens"] = str(max(0, int(b)))
            h["x-ratelimit-reset-tokens"] = f"{max(0.0, (rl.burst_tokens - b) / rl.tokens_per_s):.3f}s"
        return h

    def door_check(self, req: Request, now: float) -> tuple[Reason, float] | None:
        """A token-rate-limited tenant whose bucket cannot admit ``req`` within its class's
        max wait is refused now (``rate_limited``) rather than left to starve in the queue.
        Call with ``policy_lock`` held.  Returns (reason, retry_after_s) or None."""
        spec = self.contract.tenant(req.tenant)
        rl = spec.rate_limit
        if rl is None or self.policy is None or req.max_wait_s is None or not self.contract.admission.shed_over_max_wait:
            return None
        view = self.policy.tenant_view(req.tenant, now)
        if view is None or view.bucket is None:  # nothing queued yet (a full bucket), or no bucket kept
            return None
        wait = max(0.0, view.queued_cost - view.bucket) / rl.tokens_per_s
        limit = self.contract.admission.shed_margin * req.max_wait_s
        if wait <= limit:
            return None
        return (Reason(ReasonCode.RATE_LIMITED, f"tenant {req.tenant!r} token rate limit ({rl.tokens_per_s:g}/s) "
                f"admits this request in ~{wait:.1f}s > {limit:.1f}s (class {req.klass!r}); retry after ~{wait - limit:.0f}s"),
                wait - limit)

    # -- terminal bookkeeping
    def record(self, req: Request, endpoint: str | None = None, finish_reason: str | None = None,
               **extra: Any) -> None:
        rec = request_record(req)
        version, digest = self.admitted_by.pop(req.request_id, (self.contract.version, self.contract.content_hash))
        rec.update({"mode": self.mode, "endpoint": endpoint, "http_status": http_status_of(req),
                    "finish_reason": finish_reason, "max_tokens": req.max_tokens,
                    "contract_version": version, "contract_hash": digest}, **extra)
        self.records.add(rec)
        if req.status is not Status.REJECTED:
            self.metrics.ended(req)
        else:
            self.metrics.requests.labels(self.metrics.tenant(req.tenant), self.metrics.klass(req.klass),
                                         "rejected").inc()

    def share_snapshot(self, now: float) -> tuple[dict, dict]:
        """(recent service share, entitled share) per active tenant of a fair policy."""
        tenants = self.policy.snapshot(now).tenants if self.policy is not None else {}
        if not tenants:
            return {}, {}
        total = sum(v.recent_service for v in tenants.values())
        share = {n: (v.recent_service / total if total > 0 else 0.0) for n, v in tenants.items()}
        active = [n for n, v in tenants.items() if v.is_active]
        ent = entitled_shares({n: tenants[n].weight for n in active},
                              {n: tenants[n].min_share for n in active}) if active else {}
        return share, {n: ent.get(n, 0.0) for n in tenants}

    # -- to implement
    def model_names(self) -> list[str]:
        raise NotImplementedError

    async def list_models(self, headers) -> list[str]:
        """The model ids for ``GET /v1/models`` (``headers``: the client's request headers)."""
        return self.model_names()

    def prompt_bounds(self) -> tuple[int | None, int | None]:
        """(context in tokens, longest token in characters) for refusing a big body's prompt
        by its length alone; None where unknown (the gateway has no tokenizer)."""
        return None, None

    def kept_prompt_chars_per_token(self) -> float | None:
        """Set (the gateway: its estimate's characters per token): a big body's prompt is not
        parsed here but kept as JSON bytes by the helper process and forwarded as such
        (kept_prompt.py); None: the service needs the prompt itself (serve tokenizes it)."""
        return None

    async def prepare(self, g: GenRequest) -> None:
        """Work on ``g`` that may be slow (tokenizing), done before ``submit``, off the event loop."""

    def submit(self, g: GenRequest) -> Job:
        raise NotImplementedError

    def cancel(self, job: Job, reason: Reason = CLIENT_CLOSED) -> None:
        raise NotImplementedError

    def health(self) -> tuple[bool, dict]:
        return (not self.closing), {"mode": self.mode, "closing": self.closing}

    def snapshot(self) -> dict:
        return {}

    async def start(self) -> None:
        pass

    def begin_shutdown(self) -> None:
        """Stop accepting: new requests get 503 ``shutting_down``."""
        self.closing = True

    async def drain(self, grace_s: float) -> None:
        """Let accepted requests finish for up to ``grace_s``; then fail the rest ("shutdown")."""

    async def stop(self) -> None:
        self.prechecker.close()
        self.records.close()


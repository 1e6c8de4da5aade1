"""tokenfair's policy core, driven by vLLM's scheduler: one tokenfair ``Request`` per vLLM
request, and the policy's hooks called where vLLM's mechanics decide.

vLLM keeps the mechanics (KV blocks, the running list, chunked prefill, the model runner);
the policy (``fair`` by default, the same object the simulator and tokenfair's own engine
run, built by ``sched.registry.make_policy``) decides:

  arrival     ``on_arrival`` (a reason: the request finishes with an error at the next step,
              the reason logged) then ``enqueue``;
  order       ``pick`` (WFQ across tenants in token cost, EDF/aging inside a tenant);
  admission   ``can_admit`` (per-tenant concurrency, KV quota, token rate, reservations) and
              ``kv_blocks_to_admit`` against vLLM's free blocks: a request that fails stays
              queued and hidden from vLLM for this step (``queue.PolicyQueue``);
  budget      ``prefill_budget`` (the TPOT-shaped prefill budget) sets the step's token
              budget and chunk; running prefills are served light tenants first (order of
              ``self.running``, ``defer_prefill``);
  preemption  the victim vLLM evicts is the policy's: requests are ranked by the fair
              policy's victim key (lowest effective priority, most over its share, least
              recovery cost) and vLLM's priority-mode rule (evict the max ``priority``)
              takes the top rank;
  charges     after each step, from the tokens vLLM computed and generated
              (``on_served`` / ``on_decoded``: predicted cost at admission, corrected by
              actual use, refunded at the end, ``on_finish``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from ...runtime.intake import make_request
from ...core.kv import BlockPool
from ...core.reasons import Reason, ReasonCode
from ...core.request import Request, Status
from ...sched.arrival import arrive
from ...sched.predictor import OnlinePredictor
from ...sched.registry import make_policy
from ...workloads.workload import TraceRow
from .settings import Settings

log = logging.getLogger("tokenfair.vllm")
TENANT_ARG, CLASS_ARG = "tenant", "class"
DEFAULT_TENANT = "default"
MAX_PRIORITY_RANK = 1 << 30     # ranks stay far from any priority a client could send
DEBUG = bool(os.environ.get("TOKENFAIR_VLLM_DEBUG"))      # log every step's decisions


def identity(vreq) -> tuple[str, str | None]:
    """(tenant, requested class) from ``vllm_xargs`` (``SamplingParams.extra_args``)."""
    sp = getattr(vreq, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) or {}
    tenant = extra.get(TENANT_ARG)
    klass = extra.get(CLASS_ARG)
    return (str(tenant) if tenant else DEFAULT_TENANT), (str(klass) if klass else None)


class PolicyBridge:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.contract = settings.contract
        self.profile = settings.profile
        self.clock = clock
        self.pool = BlockPool(self.profile.num_blocks, self.profile.block_size)
        self.predictor = OnlinePredictor()
        self.policy = make_policy(settings.policy)
        self.policy.bind(self.contract, self.profile, self.pool, self.predictor)
        self.by_id: dict[str, Request] = {}
        self.rejected: dict[str, Reason] = {}   # request id -> reason, finished at the next step
        self.num_seq = 0
        self.step_started_s = clock()
        self.last_step_s = self.step_started_s
        self.step_stats: tuple[int, int, list[Request]] = (0, 0, [])
        self.counts = {"arrived": 0, "rejected": 0, "expired": 0, "finished": 0, "held_back": 0, "work_conserving": 0,
                       "preempted": 0, "urgent_preempted": 0}

    # -- arrival ----------------------------------------------------------------------
    def arrive(self, vreq) -> Request | None:
        """The tokenfair request for a new vLLM request, enqueued; None when rejected (it is
        then in ``rejected`` with its reason)."""
        now = self.clock()
        tenant, klass = identity(vreq)
        row = TraceRow(vreq.request_id, now, tenant, int(vreq.num_prompt_tokens), 0, klass=klass,
                       max_tokens=int(vreq.max_tokens))
        req, reason = make_request(row, self.num_seq, self.contract)
        self.num_seq += 1
        req.payload = vreq
        req.num_computed = int(vreq.num_computed_tokens)
        self.counts["arrived"] += 1
        if reason is None:
            reason = arrive(self.policy, self.predictor, req, now)
        if reason is not None:
            req.status, req.end_reason = Status.REJECTED, reason
            self.rejected[vreq.request_id] = reason
            self.counts["rejected"] += 1
            req.finish_s = now
            self.record(req)
            log.warning("tokenfair: request %s of tenant %r rejected: %s", vreq.request_id, tenant, reason)
            return None
        self.by_id[vreq.request_id] = req
        return req

    # -- admission --------------------------------------------------------------------
    def can_start(self, req: Request, num_running: int, now: float) -> bool:
        """May ``req`` start now (the policy gives it a chunk this step, its tenant's quotas,
        the reservations, KV for its first chunk)?  A query: nothing is counted or changed."""
        n = min(req.num_uncomputed, self.policy.chunk_for(req, now))
        return (n > 0 and self.policy.can_admit(req, now, num_running)
                and self.policy.kv_blocks_to_admit(req, n) <= self.pool.num_free)

    def eligible(self, req: Request, num_running: int, now: float) -> bool:
        """:meth:`can_start`, counting a request held back."""
        ok = self.can_start(req, num_running, now)
        if not ok:
            self.counts["held_back"] += 1
        return ok

    def within_hard_limits(self, req: Request, now: float) -> bool:
        """The contract's hard per-tenant limits only (not the soft headroom reservations):
        max_concurrency, the KV quota, the token-rate bucket, and KV for the prompt."""
        pool = self.pool
        return self.policy.can_admit_within_limits(req, now) and pool.blocks_for(req.num_uncomputed) <= pool.num_free

    def admitted(self, req: Request, now: float) -> None:
        req.status = Status.RUNNING
        if req.scheduled_s is None:
            req.scheduled_s = now
        self.policy.on_admit(req, now)

    def requeued(self, req: Request, vreq, now: float) -> None:
        """Back in the waiting queue: preempted by vLLM (recompute), or skipped this step."""
        if int(vreq.num_preemptions) > req.num_preemptions:
            self.counts["preempted"] += 1
            req.num_preemptions = int(vreq.num_preemptions)
            req.last_preempt_s = now
            req.recomputed_tokens += req.num_computed
            self.pool.drop_mirrored(req)
            req.num_computed = 0
        req.status = Status.WAITING
        self.policy.enqueue(req, now)

    # -- each step ----------------------------------------------------------------------
    def before_step(self, running: list, num_free_blocks: int) -> int:
        """Mirror vLLM's KV use, rank preemption victims, order running prefills; returns
        the step's prefill token budget (the policy's, TPOT-shaped)."""
        now = self.clock()
        self.step_started_s = now
        pool, bs = self.pool, self.pool.block_size
        holders: list[tuple[Request, int]] = []
        for vreq in running:
            req = self.by_id.get(vreq.request_id)
            if req is not None:
                holders.append((req, -(-int(vreq.num_computed_tokens) // bs)))
        pool.mirror(num_free_blocks, holders)
        self._rank_victims(running, now)
        budget = self.policy.prefill_budget(self.step_stats, now)
        if not any(r.tpot_slo_s for r in self.policy_running(running)):
            budget = self.contract.engine.prefill_token_budget    # no stream to protect: unshaped
        self._order_prefills(running, now)
        if DEBUG:
            log.warning("tokenfair step: running %d, waiting %d, free blocks %d, prefill budget %d, held %d",
                        len(running), self.policy.num_waiting(), num_free_blocks, budget, self.counts["held_back"])
        return budget

    def policy_running(self, running: list) -> list[Request]:
        return [r for r in (self.by_id.get(v.request_id) for v in running) if r is not None]

    def _rank_victims(self, running: list, now: float) -> None:
        """vLLM (priority mode) evicts the running request with the largest ``priority``:
        give the policy's first victim the largest rank.  Requests the contract protects
        (not preemptible, preempted too often, in cool-down) rank below every other."""
        keyed = []
        for i, vreq in enumerate(running):
            req = self.by_id.get(vreq.request_id)
            order = self.policy.victim_order(req, now) if req is not None else None
            if order is None:
                keyed.append(((1, i, 0, 0, 0), vreq))            # newest first (vLLM FCFS)
                continue
            protected, k0, k1, k2, k3 = order
            keyed.append(((1 - protected, -k0, -k1, -k2, -k3), vreq))   # victim last
        keyed.sort(key=lambda kv: kv[0])
        for rank, (_, vreq) in enumerate(keyed):
            vreq.priority = rank - MAX_PRIORITY_RANK

    def _order_prefills(self, running: list, now: float) -> None:
        """Running prefills the policy defers (a heavy tenant's while a light one's runs) go
        after the others: vLLM serves ``running`` in list order.  Stable, in place."""
        deferred = []
        for vreq in running:
            req = self.by_id.get(vreq.request_id)
            if req is not None and int(vreq.num_computed_tokens) < int(vreq.num_prompt_tokens):
                req.num_computed = int(vreq.num_computed_tokens)
                if self.policy.defer_prefill(req, now):
                    deferred.append(vreq)
        if deferred and len(deferred) < len(running):
            later = set(map(id, deferred))
            running[:] = [v for v in running if id(v) not in later] + deferred

    def after_step(self, scheduled: dict[str, int]) -> None:
        """Charge what the step computed and generated; end the requests vLLM finished."""
        now = self.clock()
        decoded: list[Request] = []
        num_decode = ctx = 0
        prefilling: list[Request] = []
        for rid in scheduled:
            req = self.by_id.get(rid)
            if req is None:
                continue
            vreq = req.payload
            prompt = req.prompt_tokens
            before_out = req.num_output
            before_prompt = min(prompt, req.num_computed)
            req.num_computed = int(vreq.num_computed_tokens)
            req.num_output = int(vreq.num_output_tokens)
            new_out = max(0, req.num_output - before_out)
            new_prompt = max(0, min(prompt, req.num_computed) - before_prompt)
            if req.num_output and req.first_token_s is None:
                req.first_token_s = now
            if new_prompt == 0 and new_out == 1:
                decoded.append(req)
                num_decode += 1
                ctx += req.num_computed
            elif new_prompt or new_out:
                self.policy.on_served(req, new_prompt, new_out, now)
                if req.num_computed < prompt:
                    prefilling.append(req)
            if vreq.is_finished():
                self.finish(req, now)
        if decoded:
            self.policy.on_decoded(decoded, now)
        self.step_stats = (num_decode, ctx, prefilling)
        self.policy.on_step_end(now, max(1e-6, now - self.last_step_s))
        self.last_step_s = now

    def expired(self, req: Request, reason: Reason) -> None:
        """The policy expired ``req`` (already out of its queue): vLLM ends it with an error."""
        self.by_id.pop(req.request_id, None)
        req.status, req.end_reason, req.payload = Status.EXPIRED, reason, None
        req.finish_s = self.clock()
        self.counts["expired"] += 1
        self.record(req)
        log.warning("tokenfair: request %s of tenant %r expired: %s", req.request_id, req.tenant, reason)

    def record(self, req: Request) -> None:
        """One JSON line per ended request (``tokenfair_records``): tenant, class, tokens,
        status and reason, times on the engine's monotonic clock."""
        if self.settings.records_path is None:
            return
        row = {"request_id": req.request_id, "tenant": req.tenant, "class": req.klass, "status": req.status.value,
               "reason": req.reason, "prompt_tokens": req.prompt_tokens, "output_tokens": req.num_output,
               "arrival_s": req.arrival_s, "scheduled_s": req.scheduled_s, "first_token_s": req.first_token_s,
               "finish_s": req.finish_s, "preemptions": req.num_preemptions, "charged": req.charged}
        with open(self.settings.records_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def finish(self, req: Request, now: float) -> None:
        """vLLM ended ``req`` (finished, aborted, error): end it once in the policy."""
        if self.by_id.pop(req.request_id, None) is None:
            return
        vreq = req.payload
        req.num_output = int(vreq.num_output_tokens)
        req.finish_s = now
        if req.status is Status.WAITING:
            self.policy.discard(req)
            req.status, req.end_reason = Status.FAILED, Reason(ReasonCode.VLLM, f"{vreq.status}")
        else:
            req.status, req.end_reason = Status.FINISHED, Reason(ReasonCode.VLLM, f"{vreq.status}")
            self.predictor.observe(req, req.num_output)
            self.policy.on_finish(req, now)
        req.payload = None
        self.counts["finished"] += 1
        self.record(req)

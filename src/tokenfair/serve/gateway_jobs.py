"""The requests the gateway holds, from intake to their one terminal state.

:class:`GatewayJob` is one request's state while the gateway holds it.  :class:`JobBook`
keeps the held jobs (``jobs``: every job not ended, by request id; ``running``: the ones
released to a backend) and is the one place a job ends (``end``: the policy's refund, the
predictor, the record, the client's terminal event), is re-queued after a failed attempt
(``requeue_or_fail``), is aborted (``abort``: client gone, shutdown) or is cancelled because
its backend went down (``drain_backend``).  The gateway hands it the policy, the predictor
and callbacks for what the service owns (record, metrics, clock, shutdown state, wake-up).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ..core.reasons import Reason, ReasonCode
from ..core.request import Request, Status
from .gateway_errors import scrub
from .gateway_window import Backend
from .jobs import Failed, GenRequest, Job, failed_event


class GatewayJob(Job):
    def __init__(self, g: GenRequest, req: Request) -> None:
        super().__init__(g, req)
        self.q: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.backend: Backend | None = None
        self.released_s = 0.0
        self.charge_tokens = 0
        self.retries = 0
        self.cancel_reason: Reason | None = None
        self.requeue_on_cancel = False      # cancelled because its backend went down (gateway_health)
        self.ended = False

    async def next_event(self):
        return await self.q.get()


class JobBook:
    """The gateway's held jobs and their endings (the module docstring).

    ``record(req, endpoint=, finish_reason=, **extra)``: the service's terminal record;
    ``preempted(tenant)``: counts a re-queued attempt; ``closing()``: the service is stopping
    (no more retries); ``wake()``: dispatch again; ``backends``: scrubbed from client messages."""

    def __init__(self, policy: Any, predictor: Any, backends: list[Backend], *, max_retries: int,
                 now: Callable[[], float], record: Callable[..., None], preempted: Callable[[str], None],
                 closing: Callable[[], bool], wake: Callable[[], None]) -> None:
        self.policy = policy
        self.predictor = predictor
        self.backends = backends
        self.max_retries = max_retries
        self.now = now
        self.record = record
        self.preempted = preempted
        self.closing = closing
        self.wake = wake
        self.jobs: dict[str, GatewayJob] = {}        # request id -> job, until it ends
        self.running: set[GatewayJob] = set()        # released to a backend, not ended or re-queued

    def add(self, job: GatewayJob) -> None:
        self.jobs[job.req.request_id] = job

    def abort(self, job: GatewayJob, reason: Reason) -> None:
        """End ``job`` with ``reason``: a running one through its task's cancellation."""
        req = job.req
        if job.ended or req.status.is_terminal:
            return
        if req.status is Status.RUNNING and job.task is not None and not job.task.done():
            job.cancel_reason = reason
            job.task.cancel()
            return
        if req.status is Status.WAITING:
            self.policy.discard(req)
        self.end(job, Status.FAILED, reason)

    def end(self, job: GatewayJob, status: Status, reason: Reason, event=None, http_status: int | None = None,
            finish_reason: str | None = None) -> None:
        """The job's one terminal state (later calls do nothing)."""
        if job.ended:
            return
        job.ended = True
        req = job.req
        now = self.now()
        req.status, req.end_reason, req.finish_s = status, reason, now
        if status is Status.FINISHED:
            self.predictor.observe(req, req.num_output)
            self.policy.on_finish(req, now)
        elif req.scheduled_s is not None:
            self.policy.on_finish(req, now)
        extra = {} if http_status is None else {"http_status": http_status}
        try:
            self.record(req, endpoint=job.g.kind, finish_reason=finish_reason, **extra)
        finally:    # after the record: a thread that sees no held jobs sees every record
            self.jobs.pop(req.request_id, None)
        event = event if event is not None else failed_event(req)
        if isinstance(event, Failed):     # the client never sees the backends' addresses
            event.message = scrub(event.message, self.backends)
        job.q.put_nowait(event)
        job.finished.set()
        self.wake()

    def requeue_or_fail(self, job: GatewayJob, b: Backend, reason: Reason, status: int) -> None:
        """An attempt failed before its first token: back to the queue (kept charged, counted
        as a preemption) within ``max_retries``; else the job fails with ``status``."""
        req = job.req
        now = self.now()
        if job.retries < self.max_retries and not self.closing() and req.num_output == 0:
            job.retries += 1
            self.running.discard(job)
            req.num_preemptions += 1
            req.last_preempt_s = now
            req.status = Status.WAITING
            self.policy.enqueue(req, now)
            self.preempted(req.tenant)
            return
        self.end(job, Status.FAILED, reason,
                 Failed(status, f"request failed: {reason.text}", reason.code), http_status=status)

    def drain_backend(self, b: Backend, reason: Reason) -> None:
        """Cancel every request in flight on ``b`` (it went down): re-queued when its task ends."""
        current = asyncio.current_task()
        for job in list(self.running):
            if job.backend is b and job.task is not None and not job.task.done() and job.task is not current:
                job.cancel_reason = reason
                job.requeue_on_cancel = True
                job.task.cancel()

    def proxy_done(self, job: GatewayJob, b: Backend, tokens: int, task: asyncio.Task) -> None:
        """Always runs, even for a task cancelled before it started: release the window slot
        and end a job the task did not end (cancelled: client gone or shutdown; crashed).
        A job re-queued by this task and already released again belongs to its new task."""
        b.inflight -= 1
        b.inflight_tokens -= tokens
        if job.task is not task:
            self.wake()
            return
        self.running.discard(job)
        if not job.ended and job.req.status is Status.RUNNING:
            if task.cancelled() and job.requeue_on_cancel:     # its backend went down: try another
                job.requeue_on_cancel = False
                self.requeue_or_fail(job, b, job.cancel_reason or Reason(ReasonCode.BACKEND_UNAVAILABLE), 503)
            elif task.cancelled():
                self.end(job, Status.FAILED, job.cancel_reason or Reason(ReasonCode.SHUTDOWN, "the gateway is stopping"))
            else:
                err = task.exception()
                reason = Reason(ReasonCode.GATEWAY_ERROR, f"{type(err).__name__}: {err}" if err else "proxy ended early")
                self.end(job, Status.FAILED, reason, Failed(500, reason.text, ReasonCode.GATEWAY_ERROR), http_status=500)
        self.wake()

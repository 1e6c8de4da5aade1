"""The engine worker thread of ``serve`` mode: the step loop (apply queued adds and aborts,
schedule, execute without the lock, update), and the hand-over of each step's tokens and
terminal states to the asyncio loop.

:class:`EngineWorker` is a mixin of :class:`~tokenfair.serve.engine_backend.EngineBackend`;
it uses the backend's scheduler, engine, lock and queues (see that module's docstring for
the threads and what each owns).
"""

from __future__ import annotations

import math

from ..core.reasons import NEVER_ADMITTED, Reason, ReasonCode
from ..core.request import Request, Status
from ..sched.interface import StepResult
from .engine_job import ServeJob, deliver

IDLE_POLL_S = 0.05        # wake-up period while requests wait but nothing can run (expiry, rate limits)
MAX_ENGINE_ERRORS = 3      # consecutive failed steps (raised, or every forward pass raised) -> broken


class EngineWorker:
    """The worker thread's side of :class:`~tokenfair.serve.engine_backend.EngineBackend` (a mixin)."""

    def _drain_ended(self) -> list[Request]:
        return self.sched.take_ended()

    def _publish(self, tokens: list[tuple[ServeJob, list[int]]], ended: list[Request], threadsafe: bool) -> None:
        items: list[tuple[ServeJob, tuple]] = [(job, ("tok", ids)) for job, ids in tokens]
        for req in ended:
            job = self.jobs.pop(req.request_id, None)
            if job is None or job.ended:
                continue
            job.ended = True
            if req.status is Status.REJECTED:
                self.metrics.rejected(req.tenant, req.reason_code)
            fin = getattr(req.payload, "finish_reason", None) if req.status is Status.FINISHED else None
            self.record(req, endpoint=job.g.kind, finish_reason=fin)
            items.append((job, ("end",)))
        if not items:
            return
        if threadsafe and self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(deliver, items)
            except RuntimeError:       # the event loop is closed (process exit)
                pass
        else:
            deliver(items)

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
                self.sched.abort(req, Status.FAILED, Reason(ReasonCode.ENGINE_REJECTED, str(err)), now)
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
                    r.status, r.end_reason, r.finish_s = \
                        Status.FAILED, Reason(ReasonCode.ENGINE_ERROR, f"worker stopped ({self.broken})"), now
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
                            self.sched.fail_waiting(NEVER_ADMITTED, now)
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
                if getattr(self.engine, "num_failed_steps", 0) >= MAX_ENGINE_ERRORS:
                    self.broken = f"engine_error: {MAX_ENGINE_ERRORS} steps running nothing"
            except Exception as err:  # noqa: BLE001 - keep serving; fail this step's requests
                errors += 1
                reason = Reason(ReasonCode.ENGINE_ERROR, f"{type(err).__name__}: {err}")
                result = StepResult(duration_s=0.0, failed=[(r, reason) for r, _ in out.prefill]
                                    + [(r, reason) for r in out.decode])
                if errors >= MAX_ENGINE_ERRORS:
                    self.broken = reason.text
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
                self._fail_all(Reason(ReasonCode.FAILED, f"engine broken ({self.broken})"))

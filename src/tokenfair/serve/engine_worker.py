"""The engine worker thread of ``serve`` mode: the step loop (apply queued adds and aborts,
schedule, execute without the lock, update), and the hand-over of each step's tokens and
terminal states to the asyncio loop.

:class:`EngineWorker` owns the thread, the queues the HTTP side fills under ``lock``
(``adds``, ``aborts`` of running requests, ``forgets``, ``dirty`` jobs with new tokens) and
the engine's health (``broken``, ``num_steps``).  It is handed the scheduler, the engine,
the lock, the jobs by request id (shared with the HTTP side, which adds them; the worker
removes the ended ones), the clock, and two callbacks: ``on_end(job, req)`` records a
request's terminal state (once), ``on_preempted(tenant)`` counts a preemption.  See
:mod:`tokenfair.serve.engine_backend` for the threads and what each owns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable

from ..core.reasons import Reason, ReasonCode
from ..core.request import Request, Status
from ..sched.interface import StepResult
from .engine_job import ServeJob, deliver

IDLE_POLL_S = 0.05        # wake-up period while requests wait but nothing can run (expiry, rate limits)
IDLE_SLEEP_S = 1.0         # wake-up period with nothing to do (a request wakes the worker at once)
MAX_ENGINE_ERRORS = 3      # consecutive failed steps (raised, or every forward pass raised) -> broken


class EngineWorker:
    """Runs the scheduler's steps on the engine in its own thread (the module docstring)."""

    def __init__(self, sched: Any, engine: Any, lock: Any, jobs: dict[str, ServeJob], *,
                 now: Callable[[], float], on_end: Callable[[ServeJob, Request], None],
                 on_preempted: Callable[[str], None]) -> None:
        self.sched = sched
        self.engine = engine
        self.lock = lock
        self.jobs = jobs
        self.now = now
        self.on_end = on_end
        self.on_preempted = on_preempted
        self.wake = threading.Event()
        self.adds: list[Request] = []                         # admitted, not yet given to the engine
        self.aborts: list[tuple[Request, Status, str]] = []   # running requests to end after this step
        self.forgets: list[Request] = []                      # ended: the engine may drop their state
        self.dirty: list[ServeJob] = []                       # jobs with tokens of the current step
        self.stopping = False
        self.broken: str | None = None                        # why the engine cannot serve (None: it can)
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.num_steps = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the thread; tokens and terminal states are delivered on ``loop``."""
        if self.thread is not None:
            return
        self.loop = loop
        self.thread = threading.Thread(target=self.run, name="tokenfair-engine", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def request_stop(self) -> None:
        """The thread ends after its current step (join ``thread`` to wait for it)."""
        self.stopping = True
        self.wake.set()

    # ------------------------------------------------------------------ the HTTP side (under ``lock``)
    def add(self, req: Request) -> None:
        """``req`` was admitted by the scheduler: the engine gets it before the next step."""
        self.adds.append(req)

    def abort_locked(self, req: Request, reason: Reason, now: float) -> None:
        """Fail ``req``: a running one after the step in flight, a waiting one now."""
        if req.status is Status.RUNNING:
            self.aborts.append((req, Status.FAILED, reason))
        else:
            self.sched.abort(req, Status.FAILED, reason, now)
            self.forgets.append(req)

    def fail_all(self, reason: Reason) -> None:
        """Fail every request not ended yet (shutdown, a broken engine)."""
        now = self.now()
        with self.lock:
            for job in list(self.jobs.values()):
                if not job.req.status.is_terminal:
                    self.abort_locked(job.req, reason, now)
            ended = self.drain_ended()
        self.publish([], ended, threadsafe=False)
        self.wake.set()

    def drain_ended(self) -> list[Request]:
        return self.sched.take_ended()

    def publish(self, tokens: list[tuple[ServeJob, list[int]]], ended: list[Request], threadsafe: bool) -> None:
        """Hand ``tokens`` and the ``ended`` requests' terminal states to their jobs (on the
        event loop when ``threadsafe``); each ended job is removed and recorded once."""
        items: list[tuple[ServeJob, tuple]] = [(job, ("tok", ids)) for job, ids in tokens]
        for req in ended:
            job = self.jobs.pop(req.request_id, None)
            if job is None or job.ended:
                continue
            job.ended = True
            self.on_end(job, req)
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

    # ------------------------------------------------------------------ the worker thread
    def run(self) -> None:
        try:
            self._loop()
        except Exception as err:  # noqa: BLE001 - a scheduler/engine bug: fail everything, never hang
            self._die(err)

    def _die(self, err: Exception) -> None:
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
        self.publish([], ended, threadsafe=True)

    def _take_tokens(self) -> list[tuple[ServeJob, list[int]]]:
        out = []
        for job in self.dirty:
            out.append((job, job.buf))
            job.buf = []
        self.dirty.clear()
        return out

    def _prepare_locked(self, now: float) -> None:
        """Apply what the HTTP side queued: engine adds, aborts of running requests, forgets."""
        eng = self.engine
        for req in self.forgets:
            eng.forget(req)
        self.forgets.clear()
        for req in self.adds:
            if req.status.is_terminal:
                continue
            try:
                eng.add(req)
            except ValueError as err:
                self.sched.abort(req, Status.FAILED, Reason(ReasonCode.ENGINE_REJECTED, str(err)), now)
        self.adds.clear()
        for req, status, reason in self.aborts:
            if not req.status.is_terminal:
                self.sched.abort(req, status, reason, now)
            eng.forget(req)
        self.aborts.clear()

    def _schedule_locked(self, now: float) -> tuple[Any, float]:
        """(the step to execute or None, how long to sleep when there is none)."""
        self._prepare_locked(now)
        out, sleep = None, IDLE_SLEEP_S
        sched = self.sched
        if sched.has_work():
            out = sched.schedule(now)
            if out.is_empty and not out.preempted:
                self.forgets.extend(out.aborted)
                wake = sched.after_empty_step(now)       # arrivals wake the worker themselves
                sleep = min(max(0.0, wake - now), IDLE_POLL_S)
                out = None
        return out, sleep

    def _execute(self, out, errors: int) -> tuple[StepResult, int]:
        """Run the step on the engine; a raising engine fails the step's requests."""
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
        return result, errors

    def _loop(self) -> None:
        errors = 0
        while True:
            self.wake.clear()
            with self.lock:
                if self.stopping:
                    break
                out, sleep = self._schedule_locked(self.now())
                ended = self.drain_ended()
                for req in ended:
                    if out is None or req not in out.aborted:
                        self.forgets.append(req)
            self.publish([], ended, threadsafe=True)
            if out is None:
                if not self.forgets:
                    self.wake.wait(sleep)
                continue
            result, errors = self._execute(out, errors)
            tokens = self._take_tokens()
            with self.lock:
                ended = self.sched.update_from_output(out, result, self.now())
                ended += self.drain_ended()
                for req in ended:
                    if req.status is not Status.FINISHED:
                        self.engine.forget(req)
                self.num_steps += 1
            for req, _mode in out.preempted:
                self.on_preempted(req.tenant)
            self.publish(tokens, ended, threadsafe=True)
            if self.broken is not None:
                self.fail_all(Reason(ReasonCode.FAILED, f"engine broken ({self.broken})"))

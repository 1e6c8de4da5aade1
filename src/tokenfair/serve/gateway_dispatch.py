"""The gateway's dispatcher: the loop that, while some backend's window has room, picks the
next request by the fair policy and releases it to the least-loaded backend.

:class:`Dispatcher` holds the dispatch state (the time of the last round, how long to sleep
before the next) and is handed what a release needs: the policy, the backends, the job book
(:class:`~tokenfair.serve.gateway_jobs.JobBook`: the held jobs, expiry), the contract's
``max_running`` (read every round: a live contract change moves it), the clock, and two
callbacks -- ``launch(job, b)``: the coroutine that proxies a released job, and
``on_done(job, b, tokens, task)``: run when that task ends.  A round is the pure
``sched/gateway_round.py``; a fleet gateway's round (``fleet/gateway.py``) is built from the
same public steps (``round_start``, ``next_release``, ``release``, ``set_sleep``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Awaitable, Callable, Coroutine

from ..core.request import Request, Status
from ..sched.gateway_round import admit, begin_round, next_candidate
from .gateway_jobs import GatewayJob, JobBook
from .gateway_window import Backend
from .saturation import SaturationWindow, prefill_backlog

IDLE_POLL_S = 0.05      # a round's wake-up period while requests wait (expiry, rate limits)
IDLE_SLEEP_S = 1.0      # ... while nothing waits (a new request wakes the loop at once)
MIN_SLEEP_S = 0.001     # the shortest sleep before a policy wake-up


class Dispatcher:
    """Releases waiting requests to backends with room (the module docstring)."""

    def __init__(self, policy: Any, backends: list[Backend], book: JobBook, *, max_inflight_tokens: int | None,
                 max_running: Callable[[], int], now: Callable[[], float],
                 launch: Callable[[GatewayJob, Backend], Coroutine[Any, Any, None]],
                 on_done: Callable[[GatewayJob, Backend, int, asyncio.Task], None]) -> None:
        self.policy = policy
        self.backends = backends
        self.book = book
        self.max_inflight_tokens = max_inflight_tokens   # None: no cap on a backend's predicted tokens
        self.max_running = max_running
        self.now = now
        self.launch = launch
        self.on_done = on_done
        self.last_round_s = 0.0          # when the shares last decayed
        self.sleep_s = IDLE_POLL_S       # the loop's wait for a wake-up before the next round

    async def run(self, wake: asyncio.Event, round_fn: Callable[[], Awaitable[None]],
                  stopped: Callable[[], bool]) -> None:
        """Run ``round_fn`` at every wake-up (or after ``sleep_s``) until ``stopped()``."""
        while not stopped():
            try:
                await asyncio.wait_for(wake.wait(), timeout=self.sleep_s)
            except asyncio.TimeoutError:
                pass
            wake.clear()
            try:
                await round_fn()
            except Exception as err:  # noqa: BLE001 - a policy bug must not stop the gateway
                logging.getLogger("tokenfair.gateway").exception("dispatch round failed: %s", err)
                await asyncio.sleep(IDLE_POLL_S)

    def tpot_estimate(self) -> float | None:
        """The backends' mean observed time per output token (None before any)."""
        vals = [b.tpot_ewma_s for b in self.backends if b.tpot_ewma_s is not None]
        return sum(vals) / len(vals) if vals else None

    def free_backend(self, tokens: int, prompt_tokens: int = 0) -> Backend | None:
        """The up backend with the most room (relative to its window) that can take ``tokens``
        more predicted tokens and a prompt of ``prompt_tokens`` behind its prefill backlog
        (``saturation.prefill_backlog``); ties go to the lower TTFT.  None when none can."""
        best, best_key = None, None
        cap = self.max_inflight_tokens
        now = self.now()
        for b in self.backends:
            if not b.up or b.room() <= 0:
                continue
            if cap is not None and b.inflight > 0 and b.inflight_tokens + tokens > cap:
                continue
            w = b.window
            if prompt_tokens and isinstance(w, SaturationWindow) and not w.admits_prompt(
                    prefill_backlog(j for j in self.book.running if j.backend is b), prompt_tokens, now):
                continue
            key = (-b.room() / b.window.limit, b.ttft_ewma_s or 0.0)
            if best_key is None or key < best_key:
                best, best_key = b, key
        return best

    def round_start(self, now: float) -> None:
        """Decay the shares, take the backends' time per token, expire hopeless requests."""
        expired, self.last_round_s = begin_round(self.policy, now, self.last_round_s, self.tpot_estimate())
        for req, reason in expired:
            job = self.book.jobs.get(req.request_id)
            if job is not None:
                self.book.end(job, Status.EXPIRED, reason)

    def dispatch_round(self) -> None:
        """One round: release while the policy and the backends allow, then set the sleep."""
        now = self.now()
        self.round_start(now)
        blocked: set[str] = set()
        while (nxt := self.next_release(now, blocked)) is not None:
            if nxt:
                self.release(*nxt, now)
        self.set_sleep(now)

    def next_release(self, now: float, blocked: set[str]):
        """(request, backend, tokens) to release next; () when the policy cannot admit the
        picked tenant now (it is added to ``blocked``: ask again); None: the round is over."""
        return next_candidate(self.policy, now, len(self.book.running), self.max_running(), blocked,
                              lambda req, tokens: self.free_backend(tokens, req.prompt_tokens if req else 0))

    def set_sleep(self, now: float) -> None:
        policy = self.policy
        wake = policy.next_wakeup(now)
        self.sleep_s = IDLE_POLL_S if policy.num_waiting() else IDLE_SLEEP_S
        if wake < math.inf:
            self.sleep_s = min(self.sleep_s, max(MIN_SLEEP_S, wake - now))

    def release(self, cand: Request, b: Backend, tokens: int, now: float) -> asyncio.Task:
        """Take ``cand`` from the queue, charge it, and start proxying it to ``b``."""
        admit(self.policy, cand, now)
        job = self.book.jobs[cand.request_id]
        job.backend = b
        job.released_s = now
        job.charge_tokens = tokens
        b.inflight += 1
        b.inflight_tokens += tokens
        self.book.running.add(job)
        job.task = asyncio.ensure_future(self.launch(job, b))
        job.task.add_done_callback(lambda t, job=job, b=b, n=tokens: self.on_done(job, b, n, t))
        return job.task

"""The gateway's dispatcher: the loop that, while some backend's window has room, picks the
next request by the fair policy and releases it to the least-loaded backend.

:class:`Dispatcher` is a mixin of :class:`~tokenfair.serve.gateway.Gateway`; it uses the
gateway's state and the backend client's ``_proxy`` / ``_proxy_done``.
"""

from __future__ import annotations

import asyncio
import math

from ..request import Status
from .gateway_window import Backend

IDLE_POLL_S = 0.05


class Dispatcher:
    """The dispatch loop of :class:`~tokenfair.serve.gateway.Gateway` (a mixin)."""

    async def _dispatch_loop(self) -> None:
        while not self._stopped:
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=self._sleep)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            try:
                await self._round()
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

    async def _round(self) -> None:
        """One dispatch round (a fleet gateway's round awaits its store: fleet/gateway.py)."""
        self._dispatch_round()

    def _round_start(self, now: float) -> None:
        """Decay the shares, take the backends' time per token, expire hopeless requests."""
        policy = self.policy
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

    def _dispatch_round(self) -> None:
        policy = self.policy
        now = self.now()
        self._round_start(now)
        blocked: set[str] = set()
        while (nxt := self._next_release(now, blocked)) is not None:
            if nxt:
                self._release(*nxt, now)
        self._set_sleep(now)

    def _next_release(self, now: float, blocked: set[str]):
        """(request, backend, tokens) to release next; () when the policy cannot admit the
        picked tenant now (it is added to ``blocked``: ask again); None: the round is over."""
        policy = self.policy
        if not policy.num_waiting() or len(self.running) >= self.contract.engine.max_running:
            return None
        if self._free_backend(0) is None:
            return None
        cand = policy.pick(now, blocked)
        if cand is None:
            return None
        tokens = cand.prompt_tokens + cand.predicted_remaining
        b = self._free_backend(tokens)
        if b is None:
            return None
        if not policy.can_admit(cand, now, len(self.running)):
            if policy.hol_blocking:
                return None
            blocked.add(cand.tenant)
            return ()
        return cand, b, tokens

    def _set_sleep(self, now: float) -> None:
        policy = self.policy
        wake = policy.next_wakeup(now)
        self._sleep = IDLE_POLL_S if policy.num_waiting() else 1.0
        if wake < math.inf:
            self._sleep = min(self._sleep, max(0.001, wake - now))

    def _release(self, cand, b: Backend, tokens: int, now: float) -> asyncio.Task:
        """Take ``cand`` from the queue, charge it, and start proxying it to ``b``."""
        policy = self.policy
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
        return job.task

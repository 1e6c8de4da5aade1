"""The gateway's dispatcher: the loop that, while some backend's window has room, picks the
next request by the fair policy and releases it to the least-loaded backend.

:class:`Dispatcher` is a mixin of :class:`~tokenfair.serve.gateway.Gateway`; it uses the
gateway's state and the backend client's ``_proxy`` / ``_proxy_done``.
"""

from __future__ import annotations

import asyncio
import math

from ..core.request import Status
from ..sched.gateway_round import admit, begin_round, next_candidate
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
        expired, self._last_round_s = begin_round(self.policy, now, self._last_round_s, self._tpot_estimate())
        for req, reason in expired:
            job = self.jobs.get(req.request_id)
            if job is not None:
                self._end(job, Status.EXPIRED, reason)

    def _dispatch_round(self) -> None:
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
        return next_candidate(self.policy, now, len(self.running), self.contract.engine.max_running, blocked,
                              lambda req, tokens: self._free_backend(tokens))

    def _set_sleep(self, now: float) -> None:
        policy = self.policy
        wake = policy.next_wakeup(now)
        self._sleep = IDLE_POLL_S if policy.num_waiting() else 1.0
        if wake < math.inf:
            self._sleep = min(self._sleep, max(0.001, wake - now))

    def _release(self, cand, b: Backend, tokens: int, now: float) -> asyncio.Task:
        """Take ``cand`` from the queue, charge it, and start proxying it to ``b``."""
        admit(self.policy, cand, now)
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

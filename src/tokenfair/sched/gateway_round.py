"""The gateway's layers 1-3 as one dispatch round: pure, no HTTP, no clock, no event loop.

``tokenfair gateway`` (``serve/gateway_dispatch.py``) and the fleet simulator
(``sim/fleet_gate.py``) both run their fair queue through these two functions, so the
simulated gateway is the gateway's own code:

  ``begin_round``    shares decay by the time since the last round (``on_step_end``), the
                     policy's per-token time follows the backends' observed time per output
                     token, and queued requests whose deadline can no longer be met expire;
  ``release_round``  while a backend has room: ``pick`` (overdue / below-min-share / least
                     virtual finish tag), ``can_admit`` (a tenant that fails is skipped for
                     this round, or the round stops under ``hol_blocking``), ``take`` +
                     ``on_admit`` (charges the predicted cost), then the caller's ``release``.

``choose(req, tokens)`` names the backend for a candidate (``req`` None: is any backend
free at all?), or None when none has room for ``tokens`` predicted tokens.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from ..core.reasons import Reason
from ..core.request import Request, Status
from .policy import Policy

BackendT = TypeVar("BackendT")


def begin_round(policy: Policy, now: float, last_round_s: float,
                tpot_estimate_s: float | None) -> tuple[list[tuple[Request, Reason]], float]:
    """(the requests that expired with their reasons, the new last-round time)."""
    elapsed = now - last_round_s
    if elapsed > 0:
        policy.on_step_end(now, elapsed)
        last_round_s = now
    if tpot_estimate_s is not None:
        policy.observe_step_time(tpot_estimate_s)
    return policy.expire(now), last_round_s


def next_candidate(policy: Policy, now: float, num_running: int, max_running: int, blocked: set[str],
                   choose: Callable[[Request | None, int], BackendT | None],
                   holds: Callable[[Request], bool] | None = None
                   ) -> tuple[Request, BackendT, int] | tuple[()] | None:
    """The next release of a round: (request, backend, predicted tokens); ``()`` when the
    policy cannot admit the picked tenant now, or ``holds`` keeps the picked request back for
    this round (its tenant joins ``blocked``: ask again); None when the round is over (nothing
    waiting, no room, or ``hol_blocking`` stops it at a request it cannot release)."""
    if not policy.num_waiting() or num_running >= max_running or choose(None, 0) is None:
        return None
    cand = policy.pick(now, blocked)
    if cand is None:
        return None
    if holds is not None and holds(cand):
        if policy.hol_blocking:
            return None
        blocked.add(cand.tenant)
        return ()
    tokens = cand.prompt_tokens + cand.predicted_remaining
    backend = choose(cand, tokens)
    if backend is None:
        return None
    if not policy.can_admit(cand, now, num_running):
        if policy.hol_blocking:
            return None
        blocked.add(cand.tenant)
        return ()
    return cand, backend, tokens


def admit(policy: Policy, cand: Request, now: float) -> None:
    """Take ``cand`` from the queue and charge its predicted cost (it is released)."""
    policy.take(cand)
    cand.status = Status.RUNNING
    if cand.scheduled_s is None:
        cand.scheduled_s = now
    policy.on_admit(cand, now)


def release_round(policy: Policy, now: float, num_running: int, max_running: int,
                  choose: Callable[[Request | None, int], BackendT | None],
                  release: Callable[[Request, BackendT, int], None],
                  holds: Callable[[Request], bool] | None = None) -> int:
    """Release waiting requests while a backend has room; returns the new number running.
    ``holds(req)``: keep the picked ``req`` (and its tenant) back for this round."""
    blocked: set[str] = set()
    while (nxt := next_candidate(policy, now, num_running, max_running, blocked, choose, holds)) is not None:
        if nxt:
            cand, backend, tokens = nxt
            admit(policy, cand, now)
            release(cand, backend, tokens)
            num_running += 1
    return num_running

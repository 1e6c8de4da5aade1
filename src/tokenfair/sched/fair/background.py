"""Layer 4, background prefill: work without a TPOT SLO yields to streams that have one.

A class with a TPOT SLO asks for a smooth stream; a class without one asks for throughput
(its max wait or TTFT SLO, if it has one, counts in seconds, not in steps).  While decodes
with a TPOT SLO run, the prefill of a request without a TPOT SLO is *background*, the
prefill of one with a TPOT SLO *foreground*:

* a background prefill waits behind foreground prefills and admissions (it is deferred: it
  gets the budget they leave), and a foreground prefill beside it may take the whole budget
  -- unless its tenant is persistently owed service (backlogged for ``share_tau_s`` and under
  its share, ``shares.py``): under a sustained foreground flood the budget left would hold
  it below its weight share for as long as the flood lasts;
* a step that carries a foreground prefill carries no background prefill (``yields_step``),
  so that the foreground request's first token comes after its own prefill's time, not after
  a full step of someone else's -- unless the background tenant is owed service (under its
  share of recent service, ``shares.py``: it never yields what it is entitled to);
* unless the engine is *deadline-bound*, a step whose prefill is all background is shaped
  (``shaping.py``) to at most ``LATENCY_STEP_FACTOR`` x the decode-only step of the same
  batch, so that a foreground arrival waits at most that long for the step in flight.  The
  engine is deadline-bound from an arrival whose forecast wait (``forecast.py``) exceeds
  ``TIGHT_WAIT_FRACTION`` of its max wait until that max wait has passed: then steps may be
  as large as the TPOT shaping allows, so the backlog is served at the engine's full rate
  while its deadlines run.

Symbols: ``D`` = ``MAX_BACKGROUND_DEFER_S``; for a background prefill ``r``, ``k_0`` and
``t_0`` = ``deferred_since[r]`` (its ``num_computed`` and the time when it was first held
back without progress since).

Bound.  ``r`` is held back (deferred, or sitting out a step) at ``now`` only while
``num_computed(r) > k_0`` (it was served since ``t_0``: the clock restarts) or
``now - t_0 < D``; so a background prefill goes without a chunk for at most ``D`` plus one
step, then it is scheduled in its order by the other rules (``batching.py``) like any
prefill.  The cost is the fixed part of the extra steps (a shaped step stays compute-bound
while its prefill and decodes exceed the batch the weights' memory traffic hides).
"""

from __future__ import annotations

from typing import Final

from ...core.request import Request
from ...core.stepcost import StepCost
from .queue import WaitingQueue

# a forecast wait above this fraction of the max wait makes the engine deadline-bound
TIGHT_WAIT_FRACTION: Final = 0.5
# a step with only background prefill lasts at most this many decode-only steps of its batch
LATENCY_STEP_FACTOR: Final = 2.0
# a background prefill that made no progress for this long is no longer deferred
MAX_BACKGROUND_DEFER_S: Final = 1.0


class BackgroundPrefill:
    """Which prefill is background this step, and what that changes.

    Invariants (after :meth:`refresh` for the step being built): ``active`` -- decodes with a
    TPOT SLO run and ``now >= tight_until_s`` (background steps are shaped);
    ``foreground`` -- decodes with a TPOT SLO run and a foreground prefill runs or waits;
    ``foreground_in_step`` -- one runs, or was admitted into this step (:meth:`note_admitted`);
    ``background_running`` -- decodes with a TPOT SLO run and a background prefill runs;
    ``deferred_since`` is empty unless ``foreground``."""

    def __init__(self, queue: WaitingQueue) -> None:
        self.queue = queue
        self.tight_until_s = float("-inf")      # the engine is deadline-bound until then
        self.active = False
        self.foreground = False
        self.background_running = False
        self.foreground_in_step = False
        self.deferred_since: dict[Request, tuple[int, float]] = {}

    def note_forecast(self, predicted_wait_s: float | None, max_wait_s: float, now: float) -> None:
        """An arrival forecast to wait more than ``TIGHT_WAIT_FRACTION`` of its max wait
        makes the engine deadline-bound until that max wait has passed."""
        if predicted_wait_s is not None and predicted_wait_s > TIGHT_WAIT_FRACTION * max_wait_s:
            self.tight_until_s = max(self.tight_until_s, now + max_wait_s)

    def refresh(self, tpot_decodes: bool, running_prefills: list[Request], now: float) -> None:
        """The step being built: ``tpot_decodes`` -- decodes with a TPOT SLO run;
        ``running_prefills`` -- the running requests in prefill.  O(prefills)."""
        self.active = tpot_decodes and now >= self.tight_until_s
        self.foreground_in_step = tpot_decodes and any(r.tpot_slo_s is not None for r in running_prefills)
        if not tpot_decodes:
            self.foreground = self.background_running = False
        else:
            self.background_running = any(r.tpot_slo_s is None for r in running_prefills)
            self.foreground = self.foreground_in_step or self.foreground_waiting()
        if not self.foreground and self.deferred_since:
            self.deferred_since.clear()

    def foreground_waiting(self) -> bool:
        """Some waiting request has a TPOT SLO (O(1): the queue counts them)."""
        return self.queue.num_waiting_tpot > 0

    def step_target(self, target: float, cost: StepCost, ctx: int, n: int) -> float:
        """The step-time target (TPOT shaping's ``target``) of a step whose prefill is all
        background: at most ``LATENCY_STEP_FACTOR`` x the decode-only step of ``n`` decodes
        of context sum ``ctx``."""
        if self.active and not self.foreground:
            return min(target, LATENCY_STEP_FACTOR * cost.decode_s(ctx, n))
        return target

    def note_admitted(self, req: Request) -> None:
        """``req`` was admitted into the step being built."""
        if req.tpot_slo_s is not None and self.foreground:
            self.foreground_in_step = True

    def yields_step(self, req: Request, now: float) -> bool:
        """``req``'s prefill (without a TPOT SLO) sits out a step that carries a foreground
        prefill, so that step lasts what the foreground prefill needs."""
        return self.sits_out(req) and self.held_within_bound(req, now)

    def sits_out(self, req: Request) -> bool:
        """``req``'s prefill is background and the step being built carries a foreground
        prefill (it sits the step out unless its tenant is owed service)."""
        return self.foreground_in_step and req.tpot_slo_s is None

    def would_sit_out(self, req: Request) -> bool:
        """``req``'s prefill is background and sits out this step if a foreground prefill
        runs or is admitted in it (:meth:`sits_out` once one is)."""
        return self.foreground and req.tpot_slo_s is None

    def takes_whole_budget(self, req: Request) -> bool:
        """A foreground prefill beside a background one may take the whole budget."""
        return self.background_running and req.tpot_slo_s is not None

    def defers(self, req: Request, now: float) -> bool:
        """``req``, a running prefill, waits behind foreground work this step (see Bound)."""
        return self.would_sit_out(req) and self.held_within_bound(req, now)

    def would_defer(self, req: Request, now: float) -> bool:
        """:meth:`defers` as a query: the same answer, nothing noted (O(1))."""
        return self.would_sit_out(req) and self.may_hold(req, now)

    def may_hold(self, req: Request, now: float) -> bool:
        """``req`` may be held back once more: it progressed since it was first held (or was
        never held), or it was held for less than ``MAX_BACKGROUND_DEFER_S``.  A query."""
        seen = self.deferred_since.get(req)
        return seen is None or seen[0] != req.num_computed or now - seen[1] < MAX_BACKGROUND_DEFER_S

    def held_within_bound(self, req: Request, now: float) -> bool:
        """:meth:`may_hold`, noting ``now`` as when ``req`` was first held without progress
        when it was not held yet or progressed since."""
        held = self.may_hold(req, now)
        seen = self.deferred_since.get(req)
        if seen is None or seen[0] != req.num_computed:
            self.deferred_since[req] = (req.num_computed, now)
        return held

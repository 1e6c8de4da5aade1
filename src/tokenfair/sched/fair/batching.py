"""Layer 4, the fair policy's half: how big this step's prefill is and in what order.

* the prefill budget is shaped so the predicted step (last step's decode batch plus the
  prefill) stays within ``TPOT_MARGIN`` x the tightest TPOT SLO among the running decodes
  (``tpot.py``; none has one: the contract's budget; bisection, ``shaping.py``).  The
  prefill is predicted on the longest cached prefix ``k`` among the running prefills that
  may run in the step (a background prefill that sits it out does not count): a chunk's
  attention over its prefix grows with ``k``, so the 20th chunk of a 20K prompt costs more
  than the first, and a budget shaped for ``k = 0`` would overrun the target.  When that
  prefix is a background prefill's that sits the step out (a foreground prompt is admitted),
  the step may carry the budget shaped for the prefixes in it (``extra_budget``, checked on
  the step's chunks), so the prompt is not cut for a prefix the step does not hold;
* a light tenant's prefill may take all of it (it stays light only while its recent
  service plus what it still asks for, this prompt included, is clearly under its share);
  everything else is capped at ``chunk_size`` (a 20K prompt never holds a step);
* a running prefill of a tenant that is not light waits behind light tenants' prefill work
  and behind the admissions of tenants served clearly less (``defer_prefill``);
* while a light tenant's prefill runs and the shaping binds, that prefill keeps the whole
  budget and the decodes of tenants that are not light give way instead
  (``decode_hold``): as many as the TPOT target requires, never one twice in a row;
* the budget left after admission (and the extra budget) extends the light prefills first
  (``prefill_first``): a light prompt admitted after a heavy chunk (a forced head, a
  background prefill) would otherwise be left a few tokens short, to finish a step later,
  while the top-up extends the heavy chunk;
* while decodes with a TPOT SLO run, prefill without one is *background* (``background.py``):
  it waits behind foreground work and sits out the steps that carry a foreground prefill,
  for a bounded time, unless its tenant is persistently owed service; a step of background
  prefill alone is shaped shorter unless the engine is deadline-bound.

The two orders meet when a light tenant's prefill is background: it waits behind the
foreground, so it counts as no light prefill (``yields_to_foreground``) -- neither deferring
the foreground prefills nor holding their decodes.  Were it counted, each would defer the
other, and the deferred prefills are served in admission order: on hol (seed 15) a light
docs tenant's 19K-token prompt, admitted first, would take the whole budget of ten steps
while a chat prompt beside it waits 1.2 s for its last 539 tokens.
"""

from __future__ import annotations

from typing import Final

from ...contracts.contract import Contract
from ...core.request import Request, Status
from ..policy import DecodeHold
from .background import BackgroundPrefill
from .queue import WaitingQueue
from .roster import TenantRoster
from .shaping import BudgetShaper
from .shares import LIGHT_FRACTION, ShareMeter
from .tpot import DecodeSLOs
from .wfq import VirtualTimeWFQ

TPOT_MARGIN: Final = 0.8


class PrefillShaper:
    """This step's prefill budget, chunks, deferrals and decode hold.

    Invariants: ``hold`` is the decode hold of the step being built (set by
    :meth:`prefill_budget`, None: none); ``fg_extra``: (tokens, ``k_f``) -- the step may carry
    ``tokens`` more if no chunk in it has a cached prefix over ``k_f`` (:meth:`extra_budget`);
    ``light_prefilling``: a light tenant's prefill that does not yield to foreground work
    runs in it; ``admitted_prefills``: the requests admitted in prefill since the last
    :meth:`prefill_budget` (noted by :meth:`note_admitted`)."""

    def __init__(self, contract: Contract, shaper: BudgetShaper, roster: TenantRoster, meter: ShareMeter,
                 wfq: VirtualTimeWFQ, queue: WaitingQueue, decode_slos: DecodeSLOs,
                 background: BackgroundPrefill) -> None:
        self.rebind(contract)
        self.shaper = shaper
        self.roster = roster
        self.meter = meter
        self.wfq = wfq
        self.queue = queue
        self.decode_slos = decode_slos
        self.background = background
        self.hold: DecodeHold | None = None
        self.light_prefilling = False
        self.admitted_prefills: list[Request] = []
        self.fg_extra = (0, 0)

    def rebind(self, contract: Contract) -> None:
        """The contract and the budgets every step reads, as plain fields (performance: a
        contract field read is a pydantic attribute lookup)."""
        self.contract = contract
        self.prefill_token_budget = contract.engine.prefill_token_budget
        self.chunk_size = contract.engine.chunk_size

    def note_admitted(self, req: Request) -> None:
        self.admitted_prefills.append(req)
        self.background.note_admitted(req)

    def prefill_budget(self, last_step: tuple[int, int, list[Request]], now: float) -> int:
        """The contract's prefill budget, shaped so the predicted step (with last step's decode
        batch, the prefill on the longest cached prefix of a running prefill) stays within
        ``TPOT_MARGIN`` x the tightest TPOT SLO of a running decode.
        While a light tenant's prefill runs, the prefill keeps the whole budget and the
        heavy tenants' decodes give way instead (``hold``); else a step whose prefill is all
        background is shaped shorter (``background.py``)."""
        budget = self.prefill_token_budget
        self.hold = None
        self.fg_extra = (0, 0)
        n, ctx, prefilling = last_step
        admitted, self.admitted_prefills = self.admitted_prefills, []
        running = [r for group in (prefilling, admitted) for r in group
                   if r.status is Status.RUNNING and r.in_prefill]
        slo = self.decode_slos.tightest()
        self.background.refresh(slo is not None, running, now)
        self.light_prefilling = any(self.is_light_prefill(r, now) for r in running)
        if slo is None or n == 0:
            return budget
        target = TPOT_MARGIN * slo
        if not self.light_prefilling:
            target = self.background.step_target(target, self.shaper.cost, ctx, n)
        cached = fg_cached = 0                   # the prefill's attention over its cached prefix
        background = self.background
        for r in running:
            if r.num_computed > cached and not self.sits_out_step(r, now):
                cached = r.num_computed
            if r.num_computed > fg_cached and not background.would_sit_out(r):
                fg_cached = r.num_computed
        cost = self.shaper.cost
        if cost.chunk_s(budget, ctx, n, cached) <= target:
            return budget
        if self.light_prefilling:
            self.hold = self.hold_heavy_decodes(budget, n, ctx, target, cached, now)
            return budget
        shaped = self.shaper.shaped(budget, ctx, n, target, cached)
        if fg_cached < cached:
            fg = budget if cost.chunk_s(budget, ctx, n, fg_cached) <= target else \
                self.shaper.shaped(budget, ctx, n, target, fg_cached, remember=False)
            self.fg_extra = (fg - shaped, fg_cached)
        return shaped

    def extra_budget(self, prefills: list[tuple[Request, int]]) -> int:
        """The budget was shaped for the longest cached prefix ``k`` of a background prefill
        that sits the step out if a foreground prefill is admitted; when none of the step's
        chunks has a longer prefix than the foreground's ``k_f``, the step may carry the
        budget shaped for ``k_f`` (``extra``; the top-up extends the chunks with it), so a
        foreground prompt is not cut for a prefix that is not in the step."""
        extra, fg_cached = self.fg_extra
        if extra <= 0 or any(r.num_computed > fg_cached for r, _ in prefills):
            return 0
        return extra

    def hold_heavy_decodes(self, budget: int, n: int, ctx: int, target: float, cached: int,
                           now: float) -> DecodeHold:
        """A light tenant's prefill (its TTFT) is what the TPOT shaping would otherwise cut.
        Instead, the decodes of tenants that are not light give way: all but the most of
        the planned ``n`` decodes that fit beside the whole budget are held -- never one
        twice in a row, so a held stream still decodes every other step.  O(active tenants)
        for the held set."""
        fit = self.shaper.decodes_that_fit(budget, n, ctx, target, cached)
        meter = self.meter
        level = meter.level(now)                 # read already (is_light found the light prefill)
        heavy = frozenset(t.name for t in self.roster.tenants.values()
                          if t.running and not meter.under_share(t, now, level))
        return DecodeHold(heavy, n - fit)

    def chunk_for(self, req: Request, now: float) -> int:
        """A light tenant's prefill may take the whole budget (it cannot monopolise what it
        is entitled to: ``is_light`` counts the rest of this prompt); everything else is
        capped at ``chunk_size``, so a 20K prompt never holds a step.  A light prompt longer
        than the budget is not capped either: a light arrival beside it would start sooner,
        but the long light prompts are the light tenants' P99 (capped, whale's small tenants
        are at 2.30x isolated, against 1.82x)."""
        if self.sits_out_step(req, now):
            return 0
        if self.background.takes_whole_budget(req):
            return self.prefill_token_budget
        if self.meter.is_light(self.roster.tenants[req.tenant], now, req):
            return self.prefill_token_budget
        return self.chunk_size

    def is_light_prefill(self, req: Request, now: float) -> bool:
        """``req``'s prefill is a light tenant's that does not yield to foreground work: it
        counts for ``light_prefilling`` and goes first for the top-up."""
        return (self.meter.is_light(self.roster.tenants[req.tenant], now, req)
                and not self.yields_to_foreground(req, now))

    def prefill_first(self, prefills: list[tuple[Request, int]], now: float) -> list[bool]:
        """The light prefills (:meth:`is_light_prefill`) are extended first by the top-up
        (``Policy.prefill_first``)."""
        return [self.is_light_prefill(r, now) for r, _ in prefills]

    def sits_out_step(self, req: Request, now: float) -> bool:
        """``req``'s prefill is background and sits out this step: it carries a foreground
        prefill, ``req`` may be held once more, and its tenant is not owed service."""
        return (self.background.yields_step(req, now)
                and not self.meter.under_share(self.roster.tenants[req.tenant], now))

    def yields_to_foreground(self, req: Request, now: float) -> bool:
        """``req``'s prefill is background and waits behind foreground work this step: its
        tenant is not persistently owed service (``background.py``).  Such a prefill does not
        count as a light one (``light_prefilling``) even if its tenant is light, so it
        neither defers the foreground prefills it waits behind nor holds their decodes."""
        return (self.background.would_defer(req, now)
                and not self.meter.persistently_owed(self.roster.tenants[req.tenant], now))

    def defer_prefill(self, req: Request, now: float) -> bool:
        """A running prefill of a tenant that is not light waits behind the new admissions
        and running prefills of light tenants, and behind the admissions of a waiting
        tenant recently served clearly less than its own tenant: a heavy tenant's long
        prefill cannot hold a light tenant's request back.  The deferred chunk gets the
        budget left after admissions.  First, background prefill waits behind foreground work
        (``background.py``) unless its tenant is persistently owed service."""
        meter = self.meter
        mine = self.roster.tenants[req.tenant]
        if self.background.defers(req, now) and not meter.persistently_owed(mine, now):
            return True
        if meter.is_light(mine, now, req):
            return False
        if self.light_prefilling:
            return True
        if not self.queue.num_queued:
            return False
        other = self.wfq.pick({mine.name}, prefer=lambda x: meter.is_light(x, now))
        if other is None:
            return False
        tau = meter.share_tau_s
        return (other.decayed_recent(now, tau) / other.weight
                < LIGHT_FRACTION * mine.decayed_recent(now, tau) / mine.weight)

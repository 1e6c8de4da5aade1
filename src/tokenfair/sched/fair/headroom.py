"""Headroom: KV blocks and slots a tenant above its weight share leaves free for the
tenants within theirs (the static headroom, or what those tenants used at their recent
peak up to their own weight share, whichever is larger); and, under KV pressure, room
for the running requests to grow.

Within its share means in both senses: the tenant holds at most its weight share of the
KV blocks and the slots, and it is not ahead of the others in service (the WFQ's
``S_i <= V + C / w_i``, ``wfq.py``).  Slots alone are not service: a tenant whose requests
are long prompts gets thousands of prefill tokens a step from one slot, one whose requests
are decodes a token a slot; counted by slots only, the first would own a reservation, and
take the reserved slots past the others, however far ahead of them it is.

KV growth reserve.  Admission needs the whole prompt's blocks free; the running requests
then grow by a token per decode step, and when the pool runs out one of them is evicted and
its work recovered (recomputed or swapped).  In a KV-bound engine that cycle repeats at
every admission.  So while the engine is under KV pressure -- a request had to evict for
KV blocks (``note_kv_pressure``) within the last ``KV_PRESSURE_WINDOW_S`` -- a new
request is admitted only if, besides its prompt, ``KV_GROWTH_RESERVE`` x the blocks the
running requests will still add at their predicted output lengths stay free:

    need = blocks(prompt + 1) + KV_GROWTH_RESERVE * sum_r max(0, blocks(tokens_r + rem_r) - blocks_r)

(``rem_r`` the predicted remaining output).  Two kinds of tenant are exempt: one with nothing
running (a starving tenant is not held for the others' growth), and a light one
(``ShareMeter.is_light``: under its share of service even counting what it has queued)
that holds at most its weight share of the KV blocks, the prompt's included, and of the
slots (:meth:`Headroom.blocks_to_admit`): the others' growth does not keep a tenant out
of the KV it is entitled to.  When the pool then runs out, the victim order
(``preemption.py``: lowest effective priority, then furthest ahead of the system virtual
time) decides whose request is evicted.  O(running) per admission check, only under
pressure; nothing changes while no request evicts for KV."""

from __future__ import annotations

from typing import Final

from ...contracts.contract import Contract
from ...core.kv import BlockPool
from ...core.request import Request
from .roster import TenantRoster
from .shares import ShareMeter
from .tenant import TenantState
from .wfq import VirtualTimeWFQ

PEAK_MARGIN: Final = 1.25
# the fraction of the running requests' predicted KV growth kept free under KV pressure
KV_GROWTH_RESERVE: Final = 0.5
# a KV eviction within this many seconds puts the engine under KV pressure
KV_PRESSURE_WINDOW_S: Final = 20.0
# the least other active weight that counts as another active tenant
MIN_OTHER_WEIGHT: Final = 1e-12


class Headroom:
    """Weight shares of KV and slots among the active tenants, and the reservations.

    Invariants: ``headroom_blocks`` / ``headroom_slots`` are the contract's static headroom
    fractions of the pool's blocks and of ``max_running``; ``cache`` is ``reservations()``
    as of the current step, or None (cleared at every step's end, :meth:`invalidate`)."""

    def __init__(self, contract: Contract, pool: BlockPool, roster: TenantRoster, wfq: VirtualTimeWFQ) -> None:
        self.contract = contract
        self.pool = pool
        self.roster = roster
        self.wfq = wfq
        self.headroom_blocks = 0
        self.headroom_slots = 0
        self.cache: tuple[dict[str, tuple[float, float]], float, float] | None = None
        self.kv_pressure_s = float("-inf")      # when a request last evicted for KV blocks
        self.rebind(contract)

    def rebind(self, new: Contract) -> None:
        self.contract = new
        self.max_running = new.engine.max_running   # read per admission check: a plain field
        adm = new.admission
        self.headroom_blocks = int(adm.headroom_kv_fraction * self.pool.num_blocks)
        self.headroom_slots = int(adm.headroom_slot_fraction * self.max_running)

    def invalidate(self) -> None:
        self.cache = None

    def share_of_active(self, t: TenantState) -> float:
        return t.weight / max(self.roster.active_weight + (0.0 if t.active else t.weight), t.weight)

    def within_share(self, t: TenantState, extra_blocks: int, extra_slots: int) -> bool:
        """True when ``t`` stays within its weight share (among the active tenants) of KV and of
        slots after admission (what it holds; :meth:`within_both_shares` adds service)."""
        share = self.share_of_active(t)
        return (t.kv_blocks() + extra_blocks <= share * self.pool.num_blocks
                and len(t.running) + extra_slots <= share * self.max_running)

    def within_both_shares(self, t: TenantState, extra_blocks: int, extra_slots: int) -> bool:
        """Within its share in both senses (module docstring): of what it holds after
        admission, and of service."""
        return self.within_share(t, extra_blocks, extra_slots) and self.wfq.within_share(t)

    def reserved(self, t: TenantState, num_running: int) -> tuple[int, int]:
        """(KV blocks, slots) ``t`` must leave free for the *other* active tenants that are
        within their share: what they used at their recent peak (x ``PEAK_MARGIN``), up to
        their weight share, beyond what they hold now, at least the static headroom.  (Up
        to the share: the peaks of many small tenants do not coincide, and uncapped their
        sum would hold a tenant below its own share of the slots -- forty light tenants
        with peaks of eight requests would reserve more than 256 slots.)  Nothing while the
        engine runs nothing (reservations never idle an empty engine).  O(tenants), once per step."""
        if num_running == 0:
            return (0, 0)
        if self.cache is None:
            self.cache = self.reservations()
        per, blocks, slots = self.cache
        mine = per.get(t.name)
        if mine is not None:
            blocks, slots = blocks - mine[0], slots - mine[1]
        other_active_weight = self.roster.active_weight - (t.weight if t.active else 0.0)
        if other_active_weight <= MIN_OTHER_WEIGHT:
            return (0, 0)
        return (max(self.headroom_blocks, int(blocks)), max(self.headroom_slots, int(slots)))

    def holds_slot(self, t: TenantState, num_running: int, meter: ShareMeter, now: float,
                   forced: bool = False) -> bool:
        """The slots kept for the other tenants within their share (:meth:`reserved`) hold
        ``t``'s next admission: taking a slot would leave fewer free than they keep, and ``t``
        is neither within its share (of slots and KV, and of service) nor light; ``forced``:
        the request is the forced head, never held.  A query (in this order: the step's
        reservations are read first, as admission always read them)."""
        return (num_running + 1 > self.max_running - self.reserved(t, num_running)[1]
                and not self.within_both_shares(t, 0, 1) and not forced and not meter.is_light(t, now))

    def blocks_to_admit(self, req: Request, first_chunk: int, meter: ShareMeter, keep: Request | None,
                        now: float) -> int:
        """Free blocks that must exist before ``req`` is admitted (the fair policy's
        ``kv_blocks_to_admit``); ``keep``: the forced head's reservation (``picking.py``)."""
        if req.num_preemptions:
            need = self.pool.extra_blocks(req, first_chunk)
        else:
            # KV-aware: the whole prompt must fit now, so an admitted prefill is not evicted
            need = self.pool.blocks_for(req.prompt_tokens + 1)
        t = self.roster.tenants[req.tenant]
        within = self.within_share(t, need, 0)
        if (t.running and now - self.kv_pressure_s < KV_PRESSURE_WINDOW_S
                and not (within and meter.is_light(t, now))):    # a light tenant within its share: exempt
            need += int(KV_GROWTH_RESERVE * self.running_growth_blocks())
            within = self.within_share(t, need, 0)
        if not within and not meter.under_share(t, now):
            # beyond its KV share, a tenant that is not owed service leaves the others'
            # headroom free; one that is owed service (a prompt larger than its share,
            # say) is not blocked by reservations, or it could wait for ever
            need += self.reserved(t, self.roster.num_running)[0]
        if keep is not None and keep.tenant != req.tenant:
            need += self.pool.blocks_for(keep.num_tokens + 1)   # the forced head's blocks stay free
        return need

    def note_kv_pressure(self, now: float) -> None:
        """A running request needs KV blocks that are not free (an eviction follows)."""
        self.kv_pressure_s = now

    def running_growth_blocks(self) -> int:
        """The blocks the running requests will still add at their predicted output lengths
        (module docstring).  O(running)."""
        blocks_for = self.pool.blocks_for
        growth = 0
        for o in self.roster.tenants.values():
            for r in o.running:
                g = blocks_for(r.num_tokens + r.predicted_remaining) - r.blocks
                if g > 0:
                    growth += g
        return growth

    def reservations(self) -> tuple[dict[str, tuple[float, float]], float, float]:
        """What :meth:`reserved` sums, for every tenant at once: (tenant -> (blocks, slots)
        it would reserve: ``min(PEAK_MARGIN x peak, share x capacity) - held``, their sums)
        over the active tenants with a peak that are within their share
        (``within_share(o, 0, 0)``, inlined: the same float operations, summed in tenant
        order) and not ahead in service (``wfq.within_share``).  O(tenants), at most once
        per step."""
        per: dict[str, tuple[float, float]] = {}
        blocks_sum = slots_sum = 0.0
        active_weight = self.roster.active_weight + 0.0     # every tenant counted here is active
        num_blocks = self.pool.num_blocks
        max_running = self.max_running
        held = self.pool.held
        wfq = self.wfq
        for o in self.roster.tenants.values():
            if o.active and o.kv_peak > 0:
                w = o.weight
                share = w / (w if w > active_weight else active_weight)   # max(active_weight, w)
                kv = held.get(o.name, 0)
                slots = len(o.running)
                if kv <= share * num_blocks and slots <= share * max_running and wfq.within_share(o):
                    b = min(PEAK_MARGIN * o.kv_peak, share * num_blocks) - kv
                    if not b > 0.0:
                        b = 0.0
                    sl = min(PEAK_MARGIN * o.slots_peak, share * max_running) - slots
                    if not sl > 0.0:
                        sl = 0.0
                    per[o.name] = (b, sl)
                    blocks_sum += b
                    slots_sum += sl
        return per, blocks_sum, slots_sum

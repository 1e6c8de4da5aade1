"""A forced head (guarantee.py: an overdue request of a tenant within its share) is not held
by the slot reservations kept for the tenants within their share: it is one of them.

Tenant ``a`` runs five long-lived requests that are cheap by the contract's measure (its
predicted outputs are short), tenant ``b`` one that is dear: ``a`` holds more than its weight
share of the slots while staying within its share of the service (``S_a <= V + C / w_a``).
``a``'s next request waits; the static slot headroom keeps half the slots for ``b``.  Once
it is past its max wait it is forced, and gets in -- it used to wait for ever, every pick
returning it and every admission check refusing it for slots kept for others."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.predictor import OnlinePredictor
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import SimEngine

MAX_WAIT_S = 1.0
CONTRACT = parse_contract({
    "classes": {"interactive": {"priority": 10, "aging_rate": 1.0, "max_wait_s": MAX_WAIT_S}},
    "engine": {"prefill_token_budget": 512, "decode_token_budget": 64, "chunk_size": 256, "max_running": 10},
    "admission": {"headroom_slot_fraction": 0.5, "shed_over_max_wait": False}})
PROFILE = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                  decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=200_000, block_size=16)
NEVER_ENDS = 100_000                   # output tokens: nothing finishes within the test


def _trained_predictor() -> OnlinePredictor:
    """``a``'s outputs are predicted short, ``b``'s long: ``a`` is charged little."""
    predictor = OnlinePredictor()
    for tenant, actual in (("a", 8), ("b", 4000)):
        seen = _request(-1, tenant, 0.0)
        seen.predicted_output = actual
        predictor.observe(seen, actual)
    return predictor


def _request(seq: int, tenant: str, now: float) -> Request:
    return Request(f"{tenant}{seq}", seq, tenant, "interactive", now, 32, NEVER_ENDS, priority=10.0,
                   aging_rate=1.0, max_wait_s=MAX_WAIT_S)


def test_a_forced_head_is_not_held_by_slot_reservations_for_others():
    policy = FairPolicy()
    sched = IterationScheduler(policy, CONTRACT, PROFILE, predictor=_trained_predictor())
    eng = SimEngine(PROFILE)
    first = [_request(i, "a", 0.0) for i in range(5)] + [_request(5, "b", 0.0)]
    for req in first:
        eng.add(req, NEVER_ENDS)
        sched.add_request(req, 0.0)
    now, late = 0.0, None
    while now < 3 * MAX_WAIT_S:
        if late is None and now >= 0.2:
            late = _request(6, "a", now)
            eng.add(late, NEVER_ENDS)
            sched.add_request(late, now)
        out = sched.schedule(now)
        res = eng.execute(out)
        now += res.duration_s
        sched.update_from_output(out, res, now)
        if late is not None and late.status is Status.WAITING and now < late.arrival_s + MAX_WAIT_S:
            # before its max wait it is held: over its slot share, not light
            t = policy.roster.tenants["a"]
            assert len(sched.running) == 6 and not policy.headroom.within_share(t, 0, 1)
            assert policy.wfq.within_share(t)
    assert all(r.status is Status.RUNNING for r in first)
    assert late is not None and late.status is Status.RUNNING
    assert MAX_WAIT_S <= late.scheduled_s - late.arrival_s < MAX_WAIT_S + 0.1

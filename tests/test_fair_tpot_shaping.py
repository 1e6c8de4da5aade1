"""The TPOT-shaped prefill budget follows the TPOT SLOs of the running decodes (tpot.py)."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.fair.tpot import DecodeSLOs
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import RowFedEngine, SimEngine
from tokenfair.workloads.workload import TraceRow

PROFILE = Profile(name="t", kind="linear", prefill_token_s=2e-4, prefill_batch_s=0.01, decode_base_s=0.015,
                  decode_seq_s=2e-4, kv_capacity_tokens=2_000_000, block_size=16)
CONTRACT = parse_contract({
    "classes": {"interactive": {"priority": 10, "tpot_slo_s": 0.05},
                "batch": {"priority": 0}},
    "engine": {"prefill_token_budget": 2048, "decode_token_budget": 512, "chunk_size": 512, "max_running": 512},
    "admission": {"shed_over_max_wait": False}})
BUDGET = CONTRACT.engine.prefill_token_budget


class _Recording(FairPolicy):
    """Records every prefill budget it answers (a plain-Python subclass of the compiled policy)."""

    def __init__(self):
        super().__init__()
        self.budgets: list[int] = []

    def prefill_budget(self, last_step, now):
        b = super().prefill_budget(last_step, now)
        self.budgets.append(b)
        return b


def _run(rows):
    policy = _Recording()
    sched = IterationScheduler(policy, CONTRACT, PROFILE)
    run(rows, CONTRACT, sched, RowFedEngine(SimEngine(PROFILE)), VirtualClock())
    return policy


def _batch(n, t0=0.0):
    return [TraceRow(f"b-{i}", t0 + 0.05 * i, "bulk", 3000, 200, klass="batch") for i in range(n)]


def test_batch_only_traffic_keeps_the_whole_prefill_budget():
    # a contract class has a tight TPOT SLO, but no running decode is in it: nothing to shape for
    p = _run(_batch(120))
    assert len(p.budgets) > 100
    assert min(p.budgets) == BUDGET


def test_streams_in_a_tpot_class_shape_the_budget_and_stop_when_they_end():
    streams = [TraceRow(f"s-{i}", 0.0, "stream", 64, 400) for i in range(200)]
    p = _run(streams + _batch(120, t0=1.0))
    shaped = [b for b in p.budgets if b < BUDGET]
    assert shaped                                        # the streams' SLO binds while they decode
    assert p.decode_slos.tightest() is None and not p.decode_slos.members   # all ended: none counted


def test_decode_slos_counts_each_running_decode_once():
    slos = DecodeSLOs()
    a = Request("a", 0, "t", "interactive", 0.0, 10, 5, tpot_slo_s=0.1)
    b = Request("b", 1, "t", "interactive", 0.0, 10, 5, tpot_slo_s=0.05)
    c = Request("c", 2, "t", "batch", 0.0, 10, 5)
    for r in (a, a, b, c):
        slos.start(r)
    assert slos.tightest() == 0.05 and slos.counts == {0.1: 1, 0.05: 1}
    slos.stop(b)
    assert slos.tightest() == 0.1
    slos.stop(b)                                         # not counted any more: no-op
    slos.stop(a)
    slos.stop(c)
    assert slos.tightest() is None and not slos.counts
    assert a.status is Status.WAITING                    # counting never touches the request

"""TPOT shaping predicts a prefill chunk on its cached prefix (sched/fair/batching.py).

A chunk's attention over the tokens already computed grows with them (the roofline's
``attn = c (k + c/2)``), so the last chunks of a long prompt cost more than the first; a
budget shaped as if every chunk started a prompt overruns the TPOT target there."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import BUILTIN_PROFILES
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.runtime.step_counter import StepCounter
from tokenfair.sched.fair.batching import TPOT_MARGIN
from tokenfair.sched.fair.shaping import BudgetShaper
from tokenfair.sched.registry import make_policy
from tokenfair.sim.engine import RowFedEngine, SimEngine
from tokenfair.workloads.workload import TraceRow

from step_log import StepLog

PROFILE = BUILTIN_PROFILES["llama3-8b-a100"]
SLO_S = 0.06
CONTRACT = parse_contract({
    "classes": {"interactive": {"priority": 0, "tpot_slo_s": SLO_S}},
    "engine": {"prefill_token_budget": 2048, "decode_token_budget": 512, "chunk_size": 2048, "max_running": 64},
    "admission": {"shed_over_max_wait": False}})
LONG_PROMPT = 48_000


def _step(out):
    """A step's prefill chunks as (new tokens, cached tokens) and its decodes."""
    chunks = [(n, r.num_computed - n) for r, n in out.prefill]     # grown already: k = computed - n
    return chunks, sum(r.num_computed - 1 for r in out.decode), len(out.decode)


def _run():
    rows = [TraceRow(f"s{i}", 0.01 * i, "stream", 200, 2_000) for i in range(24)]
    rows.append(TraceRow("doc", 0.5, "docs", LONG_PROMPT, 4))
    sched = StepLog(_step, make_policy("fair"), CONTRACT, PROFILE)
    run(tuple(rows), CONTRACT, sched, RowFedEngine(SimEngine(PROFILE)), VirtualClock(), None,
        fast_forward=None, recorder=StepCounter(CONTRACT.costs))
    return sched.steps


def test_steps_beside_streaming_decodes_stay_within_the_tpot_target_on_long_prefixes():
    steps = _run()
    target = TPOT_MARGIN * SLO_S
    beside = [(chunks, ctx, n) for chunks, ctx, n in steps if chunks and n >= 16]
    deep = [s for s in beside if any(k >= LONG_PROMPT // 2 for _, k in s[0])]
    assert len(deep) >= 3                      # the long prompt's late chunks ran beside the decodes
    for chunks, ctx, n in beside:
        # the shaping reads last step's decode batch: one token more context per decode
        assert PROFILE.step_s(chunks, ctx, n) <= target * 1.02, (chunks, ctx, n)
    # on those late chunks, the budget shaped as if the chunk were uncached overruns the target
    overrun = 0
    for chunks, ctx, n in deep:
        k = max(kk for _, kk in chunks)
        uncached = BudgetShaper(PROFILE.cost).shaped(2048, ctx, n, target)
        overrun += PROFILE.step_s([(uncached, k)], ctx, n) > target * 1.02
    assert overrun >= len(deep) // 2, (overrun, len(deep))

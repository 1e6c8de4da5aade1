"""A foreground prompt is not cut for a cached prefix that is not in the step
(sched/fair/batching.py, ``PrefillShaper.extra_budget``).

The TPOT-shaped budget is predicted on the longest cached prefix of the running prefills
that may run.  A background prefill (no TPOT SLO) sits out a step that carries a foreground
prefill, so when a streaming tenant's prompt is admitted beside a long document's prefill,
the step holds no deep prefix: the budget shaped for the document's prefix cut the prompt
in two steps (one more step for its first token); now the step carries the budget shaped
for the prefixes really in it."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import BUILTIN_PROFILES
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.runtime.step_counter import StepCounter
from tokenfair.sched.fair.batching import TPOT_MARGIN
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sim.engine import RowFedEngine, SimEngine
from tokenfair.workloads.workload import TraceRow

from step_log import StepLog

PROFILE = BUILTIN_PROFILES["llama3-8b-a100"]
SLO_S = 0.1
CONTRACT = parse_contract({
    "tenants": {"docs": {"default_class": "docs"}},
    "default_class": "interactive",
    "classes": {"interactive": {"priority": 20, "tpot_slo_s": SLO_S}, "docs": {"priority": 10}},
    "engine": {"prefill_token_budget": 2048, "decode_token_budget": 512, "chunk_size": 512, "max_running": 64},
    "admission": {"shed_over_max_wait": False}})
PROBE_PROMPT = 1000          # fits the budget shaped for no cached prefix, not for the document's


def _step(out):
    """A step's prefill chunks as (request, new tokens, cached tokens) and the decode batch's
    (context sum, size)."""
    chunks = [(r.request_id, n, r.num_computed) for r, n in out.prefill]
    return chunks, sum(r.num_computed - 1 for r in out.decode), len(out.decode)


class _NoExtra(FairPolicy):
    """The fair policy without the extra budget: the step keeps the deep prefix's budget."""

    def extra_prefill_budget(self, prefills):
        return 0


def _probe_steps(policy):
    rows = [TraceRow(f"s{i}", 0.01 * i, "stream", 200, 3_000) for i in range(32)]
    rows.append(TraceRow("doc", 0.5, "docs", 48_000, 4))
    rows.append(TraceRow("probe", 2.0, "probe", PROBE_PROMPT, 4))
    sched = StepLog(_step, policy, CONTRACT, PROFILE)
    run(tuple(rows), CONTRACT, sched, RowFedEngine(SimEngine(PROFILE)), VirtualClock(), None,
        fast_forward=None, recorder=StepCounter(CONTRACT.costs))
    before = [s for s in sched.steps if any(c[0] == "probe" for c in s[0])]
    doc_prefix = max(k for chunks, _, _ in sched.steps[:sched.steps.index(before[0])]
                     for rid, _, k in chunks if rid == "doc")
    return before, doc_prefix


def test_a_streaming_prompt_beside_a_deep_background_prefill_runs_in_one_step():
    steps, doc_prefix = _probe_steps(FairPolicy())
    assert doc_prefix >= 10_000                          # the document was deep into its prompt
    assert len(steps) == 1
    chunks, ctx, n = steps[0]
    assert [(rid, c) for rid, c, _ in chunks] == [("probe", PROBE_PROMPT)]   # the document sat out
    assert n == 32
    assert PROFILE.step_s([(c, k) for _, c, k in chunks], ctx, n) <= TPOT_MARGIN * SLO_S * 1.02


def test_without_the_extra_budget_the_prompt_is_cut_for_the_documents_prefix():
    steps, _ = _probe_steps(_NoExtra())
    assert len(steps) == 2
    assert sum(c for chunks, _, _ in steps for rid, c, _ in chunks if rid == "probe") == PROBE_PROMPT

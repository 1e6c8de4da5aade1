"""The top-up extends a light prompt before a heavy chunk (``Policy.prefill_first``;
sched/fair/batching.py).

On burst-long (seed 2, shedding off) a document past its max wait is forced into the step;
a streaming tenant's prompt admitted after it got what the TPOT-shaped budget left (192 of
353 tokens), and the step's extra budget then extended the document's chunk, so the
stream's first token came a step later."""

import pytest

from tokenfair.core.costmodel import BUILTIN_PROFILES
from tokenfair.core.kv import BlockPool
from tokenfair.core.request import Request
from tokenfair.evaluation.shedding import without_shedding
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.runtime.step_counter import StepCounter
from tokenfair.sched.admit import Admitter
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.interface import SchedulerOutput
from tokenfair.sched.policy import Budget, Policy
from tokenfair.sched.state import RunningSet
from tokenfair.sim.engine import RowFedEngine, SimEngine
from tokenfair.workloads.scenarios import build_scenario

from step_log import StepLog

PROFILE = BUILTIN_PROFILES["llama3-8b-a100"]
BLOCK = 16


def _chunks(out):
    """A step's chunks as (request id, tenant, new tokens, prompt tokens left)."""
    return [(r.request_id, r.tenant, n, r.num_uncomputed) for r, n in out.prefill]


class _NoFirst(FairPolicy):
    """The fair policy without ``prefill_first``: the top-up in schedule order."""

    def prefill_first(self, prefills, now):
        return None


def _steps(policy) -> list:
    # shedding off: the documents that cannot make it stay queued, and a document head is
    # forced beside the streams' prompts (with shedding on they leave the queue before that)
    wl, contract = build_scenario("burst-long", 2)
    contract = without_shedding(contract)
    rows = tuple(r for r in wl.rows if r.arrival_s < 200.0)   # the documents' max wait ends at ~180 s
    sched = StepLog(_chunks, policy, contract, PROFILE)
    run(rows, contract, sched, RowFedEngine(SimEngine(PROFILE)), VirtualClock(), None,
        fast_forward=None, recorder=StepCounter(contract.costs))
    return sched.steps


def _short_light_beside_docs(steps) -> list:
    return [s for s in steps if any(t.startswith("stream") and n < left for _, t, n, left in s)
            and any(t == "docs" and n > 1 for _, t, n, _ in s)]


def _steps_of(steps, rid: str) -> int:
    return sum(any(c[0] == rid for c in s) for s in steps)


PROBE = "burst-long-000842"        # stream-5's 353-token prompt, admitted after a forced document head


def test_the_top_up_finishes_a_light_prompt_before_extending_a_document_chunk():
    fair, plain = _steps(FairPolicy()), _steps(_NoFirst())
    assert _steps_of(fair, PROBE) == 1
    assert _steps_of(plain, PROBE) == 2                     # 192 tokens, then the last 161 a step later
    assert [c for s in plain for c in s if c[0] == PROBE][0][2:] == (192, 353)
    assert len(_short_light_beside_docs(fair)) < len(_short_light_beside_docs(plain))


def _req(rid: str, tenant: str, prompt: int) -> Request:
    return Request(rid, 0, tenant, "c", 0.0, prompt, 8)


def _admitter(num_blocks: int):
    pool = BlockPool(num_blocks, BLOCK)
    return Admitter(Policy(), RunningSet(pool), 0.0), pool


def _step(pool, chunks):
    out = SchedulerOutput()
    for r, n in chunks:
        pool.grow(r, n)
        out.prefill.append((r, n))
    return out


def test_the_top_up_extends_the_chunks_that_go_first_first():
    adm, pool = _admitter(1000)
    heavy, light = _req("h", "h", 5000), _req("l", "l", 300)
    out = _step(pool, [(heavy, 512), (light, 200)])
    adm.top_up_prefills(out, Budget(150, 0, False), [False, True])
    assert [(r.request_id, n) for r, n in out.prefill] == [("h", 562), ("l", 300)]   # 100, then 50
    h2, l2 = _req("h2", "h", 5000), _req("l2", "l", 300)
    out = _step(pool, [(h2, 512), (l2, 200)])
    adm.top_up_prefills(out, Budget(100, 0, False), None)   # schedule order: the heavy chunk takes it
    assert [(r.request_id, n) for r, n in out.prefill] == [("h2", 612), ("l2", 200)]
    for r, n in [(heavy, 562), (light, 300), (h2, 612), (l2, 200)]:
        assert r.blocks == pool.blocks_for(n)


def test_a_policy_that_marks_the_wrong_number_of_chunks_is_named():
    adm, pool = _admitter(1000)
    out = _step(pool, [(_req("h", "h", 5000), 512), (_req("l", "l", 300), 200)])
    with pytest.raises(ValueError, match=r"Policy.prefill_first returned 1 flags for 2 chunks"):
        adm.top_up_prefills(out, Budget(100, 0, False), [True])
